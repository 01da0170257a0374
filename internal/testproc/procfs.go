package testproc

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// PeakRSS is a process's peak resident set size (VmHWM in
// /proc/PID/status) in bytes: the kernel's own high-water mark, not a
// sample.
func PeakRSS(pid int) (int64, error) { return statusKB(pid, "VmHWM:") }

// ResidentFile is the part of a process's resident set backed by files
// (RssFile in /proc/PID/status) in bytes: for a static Go binary, the pages
// of its own executable it has touched. They only grow while memory is
// plentiful, so the figure read at the end bounds the file-backed part of
// every earlier resident set, the peak's included.
func ResidentFile(pid int) (int64, error) { return statusKB(pid, "RssFile:") }

func statusKB(pid int, key string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == key {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no %s", pid, key)
}

// clockTick is USER_HZ, the unit of utime and stime in /proc/PID/stat: 100
// on every Linux architecture Go supports.
const clockTick = 10 * time.Millisecond

// CPUTime is a process's user+system CPU time so far (utime+stime in
// /proc/PID/stat).
func CPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields after ')' are fixed.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad utime/stime", pid)
	}
	return time.Duration(ut+st) * clockTick, nil
}
