package replication

import (
	"fmt"
	"time"
)

// setupKeepalive keeps the server informed between Open and Run, while the
// session sets up (the producer, the checkpoint read and its barrier, the
// history check): without status updates the walsender ends the
// connection after wal_sender_timeout, and a set-up that takes longer — a
// slow Kafka, a long --kafka-linger — would restart the session. It
// confirms the slot's own confirmed position, which changes nothing on the
// server. It owns the connection until takeConn returns.
type setupKeepalive struct {
	stop chan struct{}
	done chan struct{}
	err  error // set before done is closed
}

// startSetupKeepalive sends a status update every StatusInterval on its own
// goroutine until stopped or a send fails.
func startSetupKeepalive(s *Stream) *setupKeepalive {
	k := &setupKeepalive{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(k.done)
		t := time.NewTicker(s.cfg.StatusInterval)
		defer t.Stop()
		for {
			select {
			case <-k.stop:
				return
			case <-t.C:
				if err := s.sendUpdate(s.start, s.start, false); err != nil {
					k.err = fmt.Errorf("replication: keep the connection alive before streaming: %w", err)
					return
				}
			}
		}
	}()
	return k
}

// takeConn stops the setupKeepalive, if it runs, and waits for it: the caller
// owns the connection then. It returns the setupKeepalive's failure, if any (the
// connection is broken). Called by Run and Close, on their goroutine.
func (s *Stream) takeConn() error {
	k := s.alive
	if k == nil {
		return nil
	}
	s.alive = nil
	close(k.stop)
	<-k.done
	return k.err
}
