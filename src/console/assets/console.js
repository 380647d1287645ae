// The outbox console's only script: refreshes the parts marked data-refresh while the tab is
// visible, and pauses when it is hidden. No third-party code.
(function () {
  "use strict";
  function start(el) {
    var url = el.getAttribute("data-refresh");
    var every = parseInt(el.getAttribute("data-every") || "2000", 10);
    var timer = null;
    function tick() {
      timer = null;
      if (document.hidden) return;
      fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
        .then(function (html) { el.innerHTML = html; el.removeAttribute("data-stale"); })
        .catch(function () { el.setAttribute("data-stale", "true"); })
        .then(schedule);
    }
    function schedule() {
      if (timer === null && !document.hidden) timer = setTimeout(tick, every);
    }
    document.addEventListener("visibilitychange", function () {
      if (document.hidden) {
        if (timer !== null) { clearTimeout(timer); timer = null; }
      } else {
        tick();
      }
    });
    schedule();
  }
  document.addEventListener("DOMContentLoaded", function () {
    var parts = document.querySelectorAll("[data-refresh]");
    for (var i = 0; i < parts.length; i++) start(parts[i]);
  });
})();
