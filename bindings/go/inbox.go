//go:build cgo

package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"unicode/utf8"
)

// The consumer inbox (docs/inbox.md): effectively-once processing on the consuming side, in the
// consumer's own database/sql transaction. Pure Go: it needs neither the library nor a relay, and
// no particular MySQL driver (the statements are plain SQL with ? placeholders).

// DefaultInboxTable is the inbox table's default name, the one migration V8 creates.
const DefaultInboxTable = "outbox_inbox"

// EventKeyProperty is the message property carrying the event's dedup key for the inbox.
const EventKeyProperty = "eventKey"

// Limits of the inbox's values (the columns of migration V8); longer values are refused, never
// truncated.
const (
	// MaxConsumerGroupLen is the longest consumer group, in characters of [A-Za-z0-9_%|-].
	MaxConsumerGroupLen = 255
	// MaxEventKeyBytes is the longest event key, in bytes (the column is VARBINARY(255)).
	MaxEventKeyBytes = 255
	// MaxInboxTopicChars is the longest topic stored with a mark, in characters.
	MaxInboxTopicChars = 127
	// MaxInboxMsgIDChars is the longest broker message id stored with a mark, in characters.
	MaxInboxMsgIDChars = 128
)

// InboxMessage is where a message came from, stored with its mark so that an operator can trace
// a processed key back to the broker. The zero value stores nothing (NULL columns).
type InboxMessage struct {
	// Topic is the message's topic; "" stores NULL. At most 127 characters.
	Topic string
	// QueueID and QueueOffset locate the message in its topic. They are stored only when Topic
	// is set (a queue is a queue of a topic); otherwise both columns are NULL. QueueOffset must
	// not be negative.
	QueueID     uint32
	QueueOffset int64
	// MsgID is the broker's message id, for tracing only (a resend by the relay is a new
	// message with a new id: never dedup on it); "" stores NULL. At most 128 characters.
	MsgID string
}

// Inbox marks, in the consumer's own transactions, which event keys a consumer group has
// processed, and runs a handler only for keys it has not seen. It holds only the table name:
// it is immutable and safe for concurrent use.
//
// Claim first: ProcessTx inserts the (group, key) mark in the caller's transaction BEFORE the
// handler runs. A second copy of the event handled at the same time on another connection waits
// on the mark's row lock until the first transaction ends: if it commits, the second copy is a
// duplicate (its handler does not run); if it rolls back, the second copy marks the key and runs
// its handler. A rollback of the caller's transaction un-does the mark with everything else, so
// a later copy processes the event.
type Inbox struct {
	table string
}

// DefaultInbox is the inbox on DefaultInboxTable.
var DefaultInbox = &Inbox{table: DefaultInboxTable}

// NewInbox returns an inbox on table, validated like the outbox table's name (1 to 64 letters,
// digits or underscores, not starting with a digit); the error matches ErrInvalidValue and names
// "inbox.table" and the value. Nothing is read from the database: create the table with
// Migrate (which creates outbox_inbox) or with migration V8's DDL under the new name.
func NewInbox(table string) (*Inbox, error) {
	if !validTableName(table) {
		return nil, goError(CodeInvalidValue,
			"invalid value %q for inbox.table: must be 1 to 64 letters, digits or underscores, not starting with a digit", table)
	}
	return &Inbox{table: table}, nil
}

// Table is the inbox's table name.
func (in *Inbox) Table() string {
	if in == nil || in.table == "" {
		return DefaultInboxTable
	}
	return in.table
}

// MarkTx marks key as processed by group inside tx (claim first), without running anything:
// isNew is true when the key was new and is now marked (the mark commits or rolls back with tx),
// false when a committed mark exists (a duplicate; tx stays usable, nothing was written).
//
// If another transaction holds an uncommitted mark of the same key, MarkTx waits for it to end
// (at most the server's innodb_lock_wait_timeout, then the driver's lock wait timeout error,
// 1205, retriable): a commit makes this a duplicate, a rollback lets this mark the key. Values
// are checked before anything is sent (see ProcessTx); ctx bounds the statement.
func (in *Inbox) MarkTx(ctx context.Context, tx *sql.Tx, group, key string, msg InboxMessage) (isNew bool, err error) {
	if tx == nil {
		return false, goError(CodeNullArgument, "the inbox needs a transaction")
	}
	if err := checkInboxMessage(group, key, msg); err != nil {
		return false, err
	}
	var topic, queueID, queueOffset, msgID any // nil: NULL
	if msg.Topic != "" {
		topic, queueID, queueOffset = msg.Topic, int64(msg.QueueID), msg.QueueOffset
	}
	if msg.MsgID != "" {
		msgID = msg.MsgID
	}
	// INSERT IGNORE reports a committed mark as 0 rows affected with any driver (a plain INSERT
	// would fail with a duplicate-key error whose shape is the driver's). IGNORE also turns data
	// errors into warnings: every value was checked above so that none can be truncated.
	res, err := tx.ExecContext(ctx, "INSERT IGNORE INTO "+in.Table()+
		" (consumer_group, event_key, topic, queue_id, queue_offset, msg_id, processed_at) VALUES (?, ?, ?, ?, ?, ?, NOW(3))",
		group, []byte(key), topic, queueID, queueOffset, msgID)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, err
	}
	if n != 0 && n != 1 {
		return false, goError(CodeDatabase, "the inbox's INSERT IGNORE reported %d rows affected (0 or 1 expected)", n)
	}
	return n == 1, nil
}

// ProcessTx runs handler in tx once per (group, key): it marks the key first (MarkTx), then runs
// handler(tx) only if the key was new. duplicate is true when group had already processed key (a
// committed mark exists): the handler did not run and tx is unchanged and usable. Commit tx
// afterwards either way: the mark and the handler's writes commit together; then acknowledge the
// message to the broker.
//
// If the handler returns an error, ProcessTx returns that error as is and the mark stays in tx:
// the caller must roll tx back, so that a later copy of the event processes it.
//
// Checked before anything is sent, refused with an error matching ErrInvalidEvent that names the
// field and the value: group (consumer_group) 1 to 255 characters of [A-Za-z0-9_%|-]; key
// (event_key) 1 to 255 bytes, compared byte for byte; msg.Topic at most 127 and msg.MsgID at
// most 128 characters of valid UTF-8; msg.QueueOffset not negative.
func (in *Inbox) ProcessTx(ctx context.Context, tx *sql.Tx, group, key string, msg InboxMessage, handler func(tx *sql.Tx) error) (duplicate bool, err error) {
	if handler == nil {
		return false, goError(CodeNullArgument, "the inbox needs a handler")
	}
	isNew, err := in.MarkTx(ctx, tx, group, key, msg)
	if err != nil {
		return false, err
	}
	if !isNew {
		return true, nil
	}
	return false, handler(tx)
}

// RowQuerier runs a query returning at most one row: *sql.DB, *sql.Tx and *sql.Conn are ones.
type RowQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// IsProcessed reports whether group has a mark of key visible to q. It is a pre-check only (to
// skip work early): two copies can both see false; ProcessTx is what decides.
func (in *Inbox) IsProcessed(ctx context.Context, q RowQuerier, group, key string) (bool, error) {
	if q == nil {
		return false, goError(CodeNullArgument, "the inbox needs a database, connection or transaction")
	}
	if err := checkGroup(group); err != nil {
		return false, err
	}
	if err := checkKey(key); err != nil {
		return false, err
	}
	var one int
	err := q.QueryRowContext(ctx, "SELECT 1 FROM "+in.Table()+" WHERE consumer_group = ? AND event_key = ?",
		group, []byte(key)).Scan(&one)
	if err == sql.ErrNoRows {
		return false, nil
	}
	return err == nil, err
}

// EventKey returns the message's eventKey property: the dedup key the relay sets on every event,
// unique across outbox tables and databases, to pass to ProcessTx as is. A message without it
// (or with it empty) is refused with an error matching ErrInvalidEvent that names the property;
// there is no fallback to another property.
func EventKey(properties map[string]string) (string, error) {
	key, ok := properties[EventKeyProperty]
	if !ok {
		return "", goError(CodeInvalidEvent, "invalid event: the message has no %s property (the inbox's dedup key)", EventKeyProperty)
	}
	if key == "" {
		return "", goError(CodeInvalidEvent, "invalid event: the message's %s property is empty", EventKeyProperty)
	}
	return key, nil
}

func validTableName(s string) bool {
	if s == "" || len(s) > 64 || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if !(b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '_') {
			return false
		}
	}
	return true
}

func checkInboxMessage(group, key string, msg InboxMessage) error {
	if err := checkGroup(group); err != nil {
		return err
	}
	if err := checkKey(key); err != nil {
		return err
	}
	if err := checkText("topic", msg.Topic, MaxInboxTopicChars, "a topic can be"); err != nil {
		return err
	}
	if err := checkText("msg_id", msg.MsgID, MaxInboxMsgIDChars, "the inbox keeps"); err != nil {
		return err
	}
	if msg.QueueOffset < 0 {
		return invalidInput("queue_offset", fmt.Sprintf("%d is negative", msg.QueueOffset))
	}
	return nil
}

func checkGroup(group string) error {
	if group == "" {
		return invalidInput("consumer_group", "must not be empty")
	}
	ok := len(group) <= MaxConsumerGroupLen
	for i := 0; ok && i < len(group); i++ {
		b := group[i]
		ok = b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' ||
			b == '_' || b == '-' || b == '%' || b == '|'
	}
	if !ok {
		return invalidInput("consumer_group", fmt.Sprintf(
			"%q must be 1 to %d characters of [A-Za-z0-9_%%|-] (a RocketMQ consumer group)", shorten(group), MaxConsumerGroupLen))
	}
	return nil
}

func checkKey(key string) error {
	if key == "" {
		return invalidInput("event_key", "must not be empty")
	}
	if len(key) > MaxEventKeyBytes {
		return invalidInput("event_key", fmt.Sprintf(
			"%q is %d bytes, longer than the %d the inbox holds", shorten(key), len(key), MaxEventKeyBytes))
	}
	return nil
}

func checkText(field, s string, max int, what string) error {
	if !utf8.ValidString(s) {
		return invalidInput(field, fmt.Sprintf("%q is not valid UTF-8", shorten(s)))
	}
	if n := utf8.RuneCountInString(s); n > max {
		return invalidInput(field, fmt.Sprintf("%q is %d characters, longer than the %d %s", shorten(s), n, max, what))
	}
	return nil
}

// invalidInput is the library's invalid-event error: "invalid event: <field> <reason>".
func invalidInput(field, reason string) error {
	return &Error{Code: CodeInvalidEvent, Message: "invalid event: " + field + " " + reason}
}

// shorten cuts a value to a readable length for an error message.
func shorten(s string) string {
	const shown = 40
	if utf8.RuneCountInString(s) <= shown {
		return s
	}
	n := 0
	for i := range s {
		if n == shown {
			return s[:i] + "…"
		}
		n++
	}
	return s
}
