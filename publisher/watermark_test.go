package publisher

import (
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

func TestWatermarkConfirmsEndOfContiguousDonePrefix(t *testing.T) {
	w := NewWatermark(100)
	t1, t2, t3 := w.Begin(time.Time{}), w.Begin(time.Time{}), w.Begin(time.Time{})
	w.Add(t1)
	w.Add(t2)
	w.Add(t3)
	w.Commit(t1, 200)
	w.Commit(t2, 300)
	w.Commit(t3, 400)
	check := func(want pglogrepl.LSN) {
		t.Helper()
		if got := w.Confirmed(); got != want {
			t.Fatalf("Confirmed() = %d, want %d", got, want)
		}
	}
	check(100)
	w.Ack(t2) // later transaction done first: not contiguous
	check(100)
	w.Ack(t1)
	check(300) // t1 and t2 done together
	w.Ack(t3)
	check(400)
	if n := w.InFlight(); n != 0 {
		t.Fatalf("InFlight() = %d, want 0", n)
	}
}

func TestWatermarkWaitsForCommitEvenWhenAllEventsAcked(t *testing.T) {
	w := NewWatermark(10)
	tx := w.Begin(time.Time{})
	w.Add(tx)
	w.Ack(tx) // acked, but more events may come until Commit
	if got := w.Confirmed(); got != 10 {
		t.Fatalf("confirmed %d before commit", got)
	}
	w.Commit(tx, 50)
	if got := w.Confirmed(); got != 50 {
		t.Fatalf("Confirmed() = %d, want 50", got)
	}
}

func TestWatermarkEmptyTransactionConfirmsOnCommit(t *testing.T) {
	w := NewWatermark(10)
	w.Commit(w.Begin(time.Time{}), 20)
	if got := w.Confirmed(); got != 20 {
		t.Fatalf("Confirmed() = %d, want 20", got)
	}
}

func TestWatermarkNeverMovesBack(t *testing.T) {
	w := NewWatermark(500)
	w.Commit(w.Begin(time.Time{}), 400) // a position below the start (already confirmed)
	if got := w.Confirmed(); got != 500 {
		t.Fatalf("Confirmed() = %d, want 500", got)
	}
}

func BenchmarkWatermark(b *testing.B) {
	w := NewWatermark(0)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		tx := w.Begin(time.Time{})
		w.Add(tx)
		w.Commit(tx, pglogrepl.LSN(i+1))
		w.Ack(tx)
	}
}

// Postgres 14 sends Begin/Commit for every transaction, published table or
// not: a flood of empty transactions behind one slow acknowledgement must
// not grow the queue, and confirms everything once the ack comes.
func TestWatermarkEmptyTransactionsBehindASlowAckStayBounded(t *testing.T) {
	w := NewWatermark(100)
	slow := w.Begin(time.Time{})
	w.Add(slow)
	w.Commit(slow, 200)
	for i := 0; i < 100000; i++ {
		e := w.Begin(time.Time{})
		w.Commit(e, pglogrepl.LSN(300+i))
	}
	if n := w.InFlight(); n > 3 {
		t.Fatalf("%d transactions queued behind one unacked event, want ≤ 3", n)
	}
	if got := w.Confirmed(); got != 100 {
		t.Fatalf("confirmed %d past an unacked event", got)
	}
	w.Ack(slow)
	if got := w.Confirmed(); got != pglogrepl.LSN(300+99999) {
		t.Fatalf("confirmed %d after the ack, want the last empty transaction's end %d", got, 300+99999)
	}
}
