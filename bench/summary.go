package main

import (
	"fmt"
	"slices"
)

// spread is a median with the smallest and largest value over the rounds.
type spread struct {
	Median, Min, Max float64
}

func spreadOf(v []float64) spread {
	if len(v) == 0 {
		return spread{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return spread{Median: med, Min: s[0], Max: s[len(s)-1]}
}

// String is "median (min–max)", or the value alone for one round.
func (s spread) String() string {
	if s.Min == s.Max {
		return fmt.Sprintf("%.2f", s.Median)
	}
	return fmt.Sprintf("%.2f (%.2f–%.2f)", s.Median, s.Min, s.Max)
}

// rounds returns the successful rounds of a source at a load.
func (r *report) rounds(src string, l load) []latencyResult {
	var out []latencyResult
	for _, c := range r.Latency {
		if c.Source == src && c.Load == l && c.Err == "" {
			out = append(out, c)
		}
	}
	return out
}

// stat is the spread of one field over the rounds of a cell.
func (r *report) stat(src string, l load, f func(latencyResult) float64) spread {
	var v []float64
	for _, c := range r.rounds(src, l) {
		v = append(v, f(c))
	}
	return spreadOf(v)
}

// median is a cell's rounds reduced to one result: each measure is the
// median over the rounds (nil when no round succeeded).
func (r *report) median(src string, l load) *latencyResult {
	rs := r.rounds(src, l)
	if len(rs) == 0 {
		return nil
	}
	m := rs[0]
	med := func(f func(latencyResult) float64) float64 { return r.stat(src, l, f).Median }
	m.P50Ms = med(func(c latencyResult) float64 { return c.P50Ms })
	m.P95Ms = med(func(c latencyResult) float64 { return c.P95Ms })
	m.P99Ms = med(func(c latencyResult) float64 { return c.P99Ms })
	m.MaxMs = med(func(c latencyResult) float64 { return c.MaxMs })
	m.AchievedRate = med(func(c latencyResult) float64 { return c.AchievedRate })
	m.CPUMsPer1k = med(func(c latencyResult) float64 { return c.CPUMsPer1k })
	m.PeakRSSMiB = med(func(c latencyResult) float64 { return c.PeakRSSMiB })
	m.PGCPUMsPer1k = med(func(c latencyResult) float64 { return c.PGCPUMsPer1k })
	m.PGBlocksPer1k = med(func(c latencyResult) float64 { return c.PGBlocksPer1k })
	m.Round = 0
	for _, c := range rs[1:] {
		m.Missing += c.Missing
		m.Duplicates += c.Duplicates
		m.LateKey += c.LateKey
		m.LatePartition += c.LatePartition
		m.Written += c.Written
		m.Received += c.Received
	}
	return &m
}
