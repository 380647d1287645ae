#!/usr/bin/python3
"""The operator console in a real headless Chromium, against a real outboxd and MariaDB.

Each run makes its own database, seeds it (dead letters whose every text column holds markup),
starts `outboxd run` with the console on a free port, and drives the pages as an operator does:
logging in, filtering, replaying and discarding, pausing, and what must be refused (a reader's
action, a forged CSRF token, no session at all). Every page is checked for browser console
errors (a blocked script or style under the content security policy is one) and for markup from
the table turning into elements.

    OUTBOXD=target/debug/outboxd tests/browser/console_test.py
    OUTBOX_SCREENSHOTS=docs/console  ... also saves the screenshots docs/console.md shows

Needs chromium, chromium-driver and python3-selenium (tests/browser/run.sh installs them).
"""

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import (
    NoAlertPresentException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

OUTBOXD = os.environ.get("OUTBOXD", "target/debug/outboxd")
MYSQL = os.environ.get("OUTBOX_TEST_MYSQL", "mysql://root@127.0.0.1:3306")
NAMESRV = os.environ.get("OUTBOX_TEST_NAMESRV", "127.0.0.1:9876")
SCREENSHOTS = os.environ.get("OUTBOX_SCREENSHOTS")
ADMIN = "admin-" + "%032x" % random.getrandbits(128)
READ = "read-" + "%032x" % random.getrandbits(128)
# Markup in every text column: it must stay text. The img's onerror would set a flag if it ran.
XSS = "<img src=x onerror=__xss=1><script>__xss=2</script>"
WAIT_S = 20


def mysql_args():
    u = urllib.parse.urlparse(MYSQL)
    args = ["mysql", "-h", u.hostname or "127.0.0.1", "-P", str(u.port or 3306), "-u", u.username or "root"]
    if u.password:
        args.append("-p" + u.password)
    return args


def sql(db, statement):
    """Runs statements, returns rows as lists of strings (tab-separated output)."""
    run = subprocess.run(
        mysql_args() + (["-D", db] if db else []) + ["-N", "-B", "-e", statement], capture_output=True, text=True
    )
    if run.returncode != 0:
        raise RuntimeError("mysql: %s\n%s" % (run.stderr.strip(), statement[:300]))
    out = run.stdout
    return [line.split("\t") for line in out.splitlines()]


def quote(s):
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gone(element):
    """Whether the page holding `element` has been replaced. Selenium's staleness_of knows only
    StaleElementReferenceException; during the navigation chromedriver may instead answer "Node
    with given id does not belong to the document", which says the same."""
    try:
        element.is_enabled()
        return False
    except StaleElementReferenceException:
        return True
    except WebDriverException as e:
        if "does not belong to the document" in (e.msg or ""):
            return True
        raise


class Console(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        try:
            cls.start()
        except BaseException:
            # unittest does not call tearDownClass when this fails: leave nothing behind.
            cls.tearDownClass()
            raise

    @classmethod
    def start(cls):
        cls.db = "outbox_browser_%08x" % random.getrandbits(32)
        sql(None, "CREATE DATABASE " + cls.db)
        cls.dir = tempfile.mkdtemp(prefix="outbox-console-")
        cls.port = free_port()
        cls.base = "http://127.0.0.1:%d" % cls.port
        config = os.path.join(cls.dir, "outbox.toml")
        with open(config, "w") as f:
            f.write(
                "\n".join(
                    [
                        'db.url = "%s/%s"' % (MYSQL, cls.db),
                        'rocketmq.namesrv = "%s"' % NAMESRV,
                        'table = "outbox_event"',
                        "console.enabled = true",
                        'console.listen = "127.0.0.1:%d"' % cls.port,
                        'console.admin.token = "%s"' % ADMIN,
                        'console.read.token = "%s"' % READ,
                        "",
                    ]
                )
            )
        subprocess.run([OUTBOXD, "-c", config, "migrate"], check=True, capture_output=True)
        cls.seed()
        cls.log = open(os.path.join(cls.dir, "outboxd.log"), "w")
        cls.daemon = subprocess.Popen(
            [OUTBOXD, "-c", config, "run"], stdout=cls.log, stderr=subprocess.STDOUT, env=dict(os.environ, RUST_LOG="info")
        )
        cls.wait_for_console()
        options = webdriver.ChromeOptions()
        for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"]:
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        cls.browser = webdriver.Chrome(options=options)
        cls.browser.set_page_load_timeout(WAIT_S)

    @classmethod
    def tearDownClass(cls):
        try:
            if getattr(cls, "browser", None):
                cls.browser.quit()
        finally:
            if getattr(cls, "daemon", None):
                cls.daemon.terminate()
                try:
                    cls.daemon.wait(30)
                except subprocess.TimeoutExpired:
                    cls.daemon.kill()
                cls.log.close()
            if os.environ.get("OUTBOX_KEEP"):
                print("kept", cls.dir, "and database", cls.db, file=sys.stderr)
            else:
                if getattr(cls, "db", None):
                    sql(None, "DROP DATABASE IF EXISTS " + cls.db)
                if getattr(cls, "dir", None):
                    shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def seed(cls):
        rows = []
        for i in range(40):
            status, error = ("FAIL", quote("broker said " + XSS)) if i < 6 else ("SUCCESS", "NULL")
            biz = XSS if i == 0 else "ORD-%04d" % i
            etype = "ORDER_<b>PAID</b>" if i == 1 else "ORDER_CREATED"
            rows.append(
                "(%s, %s, %s, 'console_browser', '%s', 8, %s, UUID(), %s)"
                % (quote(biz), quote(etype), quote(XSS if i == 0 else '{"n":%d}' % i), status, error,
                   "NOW(3)" if status == "SUCCESS" else "NULL")
            )
        sql(
            cls.db,
            "INSERT INTO outbox_event (biz_no, event_type, payload, topic, status, retry_count, last_error, event_key, "
            "sent_at) VALUES " + ",".join(rows),
        )
        for i in range(3):
            sql(
                cls.db,
                "INSERT INTO outbox_inbox_dead_letter (consumer_group, event_key, topic, body, attempts, last_error) "
                "VALUES ('points', 'key-%d', 'console_browser', %s, 3, %s)" % (i, quote(XSS), quote("handler: " + XSS)),
            )

    @classmethod
    def wait_for_console(cls):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if cls.daemon.poll() is not None:
                raise RuntimeError("outboxd exited: see " + cls.log.name)
            try:
                urllib.request.urlopen(cls.base + "/login", timeout=2).read()
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)  # polling for the port to open, not a stand-in for a result
        raise RuntimeError("the console never listened on " + cls.base)

    # --- helpers ---------------------------------------------------------------------------

    def open(self, path):
        self.browser.get(self.base + path)
        self.assert_clean(path)

    def assert_clean(self, where):
        """No browser console error (CSP violations included) and no markup from the table ran."""
        errors = [e for e in self.browser.get_log("browser") if e["level"] == "SEVERE"]
        # A 4xx page is an expected answer; Chromium logs its status as an error: skip those lines.
        errors = [e for e in errors if "the server responded with a status of 4" not in e["message"]]
        self.assertEqual(errors, [], "browser console errors on " + where)
        self.assertIsNone(self.browser.execute_script("return window.__xss"), "table markup ran on " + where)
        try:
            self.browser.switch_to.alert
            self.fail("an alert opened on " + where)
        except NoAlertPresentException:
            pass

    def shot(self, name):
        if SCREENSHOTS:
            os.makedirs(SCREENSHOTS, exist_ok=True)
            self.browser.save_screenshot(os.path.join(SCREENSHOTS, name + ".png"))

    def login(self, token, name):
        self.browser.delete_all_cookies()
        self.open("/login")
        self.browser.find_element(By.NAME, "name").send_keys(name)
        self.browser.find_element(By.NAME, "token").send_keys(token)
        self.submit("form.login button")

    def submit(self, css, by=By.CSS_SELECTOR):
        """Clicks a button or link and waits for the page it leads to."""
        old = self.browser.find_element(By.TAG_NAME, "html")
        self.browser.find_element(by, css).click()
        WebDriverWait(self.browser, WAIT_S).until(lambda _: gone(old))
        self.assert_clean("after " + css)

    def text(self):
        return self.browser.find_element(By.TAG_NAME, "main").text

    def status_of(self, biz):
        """The row's status, or "DELETED" when it is gone: a row sent on its first attempt is
        deleted (`sent.rows = delete`, the default)."""
        rows = sql(self.db, "SELECT status FROM outbox_event WHERE biz_no = %s" % quote(biz))
        return rows[0][0] if rows else "DELETED"

    # --- tests (run in name order) -----------------------------------------------------------

    def test_1_nobody_is_sent_to_the_login_and_a_wrong_token_is_refused(self):
        self.browser.delete_all_cookies()
        self.open("/events")
        self.assertTrue(self.browser.current_url.endswith("/login"), self.browser.current_url)
        self.login("not-the-token-at-all", "mallory")
        self.assertIn("wrong token", self.text())
        # A request with no session acts on nothing.
        req = urllib.request.Request(
            self.base + "/controls/pause", data=b"reason=x", method="POST", headers={"Origin": self.base}
        )
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req)
        self.assertIn(e.exception.code, (401, 403))
        self.assertEqual(sql(self.db, "SELECT COUNT(*) FROM outbox_control")[0][0], "0")

    def test_2_a_reader_sees_every_page_with_the_table_s_markup_as_text(self):
        self.login(READ, "rita")
        self.assertIn("Overview", self.browser.title)
        self.assertIn("FAIL (dead letters)", self.text())
        self.shot("overview")
        for path in ["/events", "/dead-letters", "/ordered", "/consumers", "/consumers/points", "/controls", "/audit"]:
            self.open(path)
        # The filter: FAIL rows only, and the markup shows as the characters it is.
        self.open("/events")
        Select(self.browser.find_element(By.NAME, "status")).select_by_visible_text("FAIL")
        self.submit("form.filters button")
        self.assert_clean("filtered events")
        self.assertIn("status=FAIL", self.browser.current_url)
        statuses = {td.text for td in self.browser.find_elements(By.CSS_SELECTOR, "table.events tbody td:nth-child(2)")}
        self.assertEqual(statuses, {"FAIL"})
        self.assertIn(XSS, self.text())
        self.assertIn("ORDER_<b>PAID</b>", self.text())
        self.assertEqual(self.browser.find_elements(By.CSS_SELECTOR, "main img, main b, main script:not([src])"), [])
        self.shot("events")
        # The detail page of the row whose every column is markup.
        row_id = sql(self.db, "SELECT id FROM outbox_event WHERE biz_no = %s" % quote(XSS))[0][0]
        self.open("/events/" + row_id)
        self.assertIn("broker said " + XSS, self.text())
        # A reader is offered no action.
        self.open("/dead-letters")
        self.assertEqual(self.browser.find_elements(By.CSS_SELECTOR, "button[value=replay]"), [])
        # The overview refreshes itself: its live part is fetched again by the page's script.
        self.open("/")
        # Mark what is shown now; the script replaces it with a fresh copy while the tab is visible.
        self.browser.execute_script("document.querySelector('#live > *').setAttribute('data-seen', 'old')")
        WebDriverWait(self.browser, WAIT_S).until(
            lambda b: b.execute_script(
                "var l = document.getElementById('live');"
                "return l.children.length > 0 && l.querySelector('[data-seen]') === null && !l.hasAttribute('data-stale')"
            )
        )
        self.assert_clean("overview after a refresh")

    def test_3_an_admin_replays_and_discards_dead_letters_audited_with_the_name(self):
        self.login(ADMIN, "alice")
        self.open("/dead-letters")
        self.shot("dead-letters")
        row = self.browser.find_element(By.XPATH, "//tr[td[contains(., 'ORD-0002')]]")
        row.find_element(By.CSS_SELECTOR, "input[type=checkbox]").click()
        self.submit("button[value=replay]")
        self.assert_clean("replay preview")
        self.assertIn("1 row(s)", self.text())
        self.assertEqual(self.status_of("ORD-0002"), "FAIL", "a preview changes nothing")
        self.shot("replay-confirm")
        self.submit("button.danger")
        self.assert_clean("replay done")
        self.assertIn("replayed", self.text())
        # Back to WAIT, retry_count 0 (and the running relay may already have sent it: then, on
        # what is again its first attempt, it is deleted).
        self.assertIn(self.status_of("ORD-0002"), ("WAIT", "SENDING", "SUCCESS", "DELETED"))
        self.assertEqual(self.status_of("ORD-0003"), "FAIL")

        # Discard every dead letter matching a filter on the error text.
        self.open("/dead-letters?biz_no=ORD-0003")
        self.browser.find_element(By.NAME, "scope").click()
        self.submit("button[value=discard]")
        self.assertIn("1 row(s)", self.text())
        self.submit("button.danger")
        self.assert_clean("discard done")
        self.assertEqual(self.status_of("ORD-0003"), "DISCARDED")

        audit = sql(self.db, "SELECT action, actor FROM outbox_audit WHERE event_id <> 0 ORDER BY id")
        self.assertEqual([a[0] for a in audit], ["replay", "discard"])
        self.assertTrue(all(a[1].startswith("alice") for a in audit), audit)
        self.open("/audit")
        self.assertIn("console replay", self.text())
        self.assertIn("alice", self.text())
        self.shot("audit")

    def test_4_a_forged_csrf_token_changes_nothing(self):
        self.login(ADMIN, "alice")
        self.open("/dead-letters")
        self.browser.find_element(By.XPATH, "//tr[td[contains(., 'ORD-0004')]]//input[@type='checkbox']").click()
        self.browser.execute_script(
            "document.querySelectorAll('input[name=csrf]').forEach(function (e) { e.value = 'forged'; })"
        )
        self.submit("button[value=replay]")
        self.assertIn("CSRF", self.text())
        self.assertEqual(self.status_of("ORD-0004"), "FAIL")
        # And a reader's session cannot act even with its own valid token.
        self.login(READ, "rita")
        self.open("/controls")
        self.assertEqual(self.browser.find_elements(By.CSS_SELECTOR, "form[action='/controls/pause'] button"), [])

    def test_5_pause_and_resume_show_on_the_overview_and_in_the_audit(self):
        self.login(ADMIN, "alice")
        self.open("/controls")
        self.browser.find_element(By.NAME, "reason").send_keys("broker <upgrade>")
        self.submit("form[action='/controls/pause'] button")
        self.assert_clean("paused")
        self.assertEqual(sql(self.db, "SELECT paused, reason FROM outbox_control")[0], ["1", "broker <upgrade>"])
        self.open("/")
        WebDriverWait(self.browser, WAIT_S).until(lambda b: "paused" in b.find_element(By.TAG_NAME, "main").text)
        self.shot("paused")
        self.open("/controls")
        self.submit("form[action='/controls/resume'] button")
        self.assertEqual(sql(self.db, "SELECT paused FROM outbox_control")[0], ["0"])
        actions = [r[0] for r in sql(self.db, "SELECT action FROM outbox_audit WHERE action IN ('pause', 'resume')")]
        self.assertEqual(actions, ["pause", "resume"])

    def test_6_a_consumer_group_s_dead_letter_is_replayed(self):
        self.login(ADMIN, "alice")
        self.open("/consumers")
        self.submit("points", By.LINK_TEXT)
        self.assert_clean("group page")
        self.assertIn("handler: " + XSS, self.text())
        self.shot("consumer-group")
        self.browser.find_element(By.XPATH, "//tr[td[contains(., 'key-1')]]//input[@type='checkbox']").click()
        self.submit("button[value=replay]")
        self.submit("button.danger")
        self.assert_clean("group replay")
        rows = sql(self.db, "SELECT event_key, status FROM outbox_inbox_dead_letter ORDER BY event_key")
        self.assertEqual(rows, [["key-0", "DEAD"], ["key-1", "REPLAY"], ["key-2", "DEAD"]])

    def test_7_overview_json_for_scripts_needs_a_token(self):
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(self.base + "/api/overview.json")
        self.assertEqual(e.exception.code, 401)
        req = urllib.request.Request(self.base + "/api/overview.json", headers={"Authorization": "Bearer " + READ})
        doc = json.load(urllib.request.urlopen(req))
        self.assertIn("fail", doc)

    def test_8_an_admin_cancels_a_scheduled_event_from_its_page(self):
        sql(
            self.db,
            "INSERT INTO outbox_event (biz_no, event_type, payload, topic, status, retry_count, next_retry_time, "
            "event_key) VALUES (%s, 'ORDER_TIMEOUT', '{}', 'console_browser', 'WAIT', 0, NOW(3) + INTERVAL 1 HOUR, UUID())"
            % quote("LATER-" + XSS),
        )
        event_id = sql(self.db, "SELECT id FROM outbox_event WHERE biz_no = %s" % quote("LATER-" + XSS))[0][0]
        self.login(ADMIN, "alice")
        self.open("/")
        self.assertIn("WAIT, scheduled", self.text())
        self.open("/events/" + event_id)
        self.assertIn("LATER-" + XSS, self.text())
        self.submit("form[action='/events/%s/cancel'] button" % event_id)
        self.assertIn("cancelled before it was sent", self.text())
        self.shot("cancelled")
        self.assertEqual(sql(self.db, "SELECT COUNT(*) FROM outbox_event WHERE id = " + event_id), [["0"]])
        audit = sql(self.db, "SELECT actor FROM outbox_audit WHERE action = 'cancel' AND event_id = " + event_id)
        self.assertEqual(len(audit), 1)
        self.assertIn("alice", audit[0][0])

    def test_9_an_admin_counts_sent_events_and_re_emits_them(self):
        for i in range(3):
            sql(
                self.db,
                "INSERT INTO outbox_event (biz_no, event_type, payload, topic, status, retry_count, event_key) "
                "VALUES (%s, 'REEMIT_ME', '{}', 'console_browser', 'SUCCESS', 0, UUID())" % quote("RE-%d-" % i + XSS),
            )
        self.login(ADMIN, "alice")
        self.open("/re-emit")
        self.browser.find_element(By.NAME, "event_type").send_keys("REEMIT_ME")
        self.submit("form.filters button")
        self.assertIn("3 sent events match (type REEMIT_ME", self.text())
        self.shot("re-emit-count")
        rate = self.browser.find_element(By.CSS_SELECTOR, "form[action='/re-emit/start'] input[name='rate']")
        rate.clear()
        rate.send_keys("50")
        self.submit("form[action='/re-emit/start'] button")
        self.assertIn("started: 3 events at 50/s", self.text())
        job = sql(self.db, "SELECT MAX(id) FROM outbox_reemit")[0][0]
        WebDriverWait(self.browser, WAIT_S).until(
            lambda _: sql(self.db, "SELECT state FROM outbox_reemit WHERE id = " + job) == [["DONE"]]
        )
        self.open("/re-emit")
        self.assertIn("3 of 3", self.text())
        self.assertIn("DONE", self.text())
        self.shot("re-emit-jobs")
        # The daemon's relay sends the copies (and deletes them as sent: sent.rows = delete); the
        # job counted each one it wrote.
        self.assertEqual(sql(self.db, "SELECT emitted FROM outbox_reemit WHERE id = " + job), [["3"]])
        audit = sql(self.db, "SELECT actor FROM outbox_audit WHERE action = 'reemit'")
        self.assertEqual(len(audit), 1)
        self.assertIn("alice", audit[-1][0])


if __name__ == "__main__":
    unittest.main(verbosity=2)
