package main

import (
	"os"
	"runtime/debug"

	"go.uber.org/zap"
)

// memLimitOverhead is what the soft memory limit allows beyond twice the
// byte budget: the runtime's own structures, stacks and freed pages not yet
// returned, the packages' static data (~4 MiB live), the replication
// connection's read buffer and the decoded event waiting for room (2 × the
// largest event), sarama's clients and metadata. The executable's own
// pages are outside it (file-backed: README "Memory").
const memLimitOverhead = 24 << 20

// memLimit is the soft memory limit run gives Go's collector for a byte
// budget of budget: 2 × budget + memLimitOverhead.
//
// Without it the collector lets the heap grow to twice what was live at
// its last cycle (GOGC=100), and what is live at the top of a drain is the
// budget's records plus the produce requests being encoded from them, so
// the heap's peak was about 4 × the budget (README "Memory"). With it the
// collector runs as the heap nears the limit instead; what is live stays
// well below it (the budget's records, at most half the budget in requests
// being encoded — kafka.Config.EncodedBytes —, the overhead above), so the
// limit binds without making the collector run continuously.
func memLimit(budget int64) int64 { return 2*budget + memLimitOverhead }

// setMemoryLimit sets memLimit(budget) as Go's soft memory limit, unless
// GOMEMLIMIT was set: an operator's own limit (e.g. a container's, minus
// headroom) wins.
func setMemoryLimit(budget int64, log *zap.Logger) {
	if v := os.Getenv("GOMEMLIMIT"); v != "" {
		log.Info("GOMEMLIMIT is set: the memory limit derived from --max-in-flight-bytes is not used", zap.String("GOMEMLIMIT", v))
		return
	}
	debug.SetMemoryLimit(memLimit(budget))
	log.Info("Go's soft memory limit set from --max-in-flight-bytes (2 × budget + 24 MiB; GOMEMLIMIT overrides it)",
		zap.Int64("limit_bytes", memLimit(budget)))
}
