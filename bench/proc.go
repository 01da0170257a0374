package main

import (
	"os"
	"strconv"
	"strings"
)

// The children (outboxd, the ceiling) run under internal/testproc, which
// also reads their CPU time and peak RSS from /proc.

// loadAvg is the 1-minute load average.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}
