package main

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
)

var (
	white   = color.RGBA{255, 255, 255, 255}
	black   = color.RGBA{30, 30, 30, 255}
	grey    = color.RGBA{120, 120, 120, 255}
	grid    = color.RGBA{225, 225, 225, 255}
	palette = []color.RGBA{{31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {148, 103, 189, 255}, {140, 86, 75, 255}, {227, 119, 194, 255}}
)

// tint mixes c with white: f = 0 is c, f = 1 is white.
func tint(c color.RGBA, f float64) color.RGBA {
	m := func(v uint8) uint8 { return uint8(float64(v) + (255-float64(v))*f) }
	return color.RGBA{m(c.R), m(c.G), m(c.B), 255}
}

// sourceColors gives every source, latency or drain, one colour.
func (r *report) sourceColors() map[string]color.RGBA {
	cs := map[string]color.RGBA{ceilingName: grey}
	next := 0
	add := func(name string) {
		if _, ok := cs[name]; !ok {
			cs[name] = palette[next%len(palette)]
			next++
		}
	}
	for _, s := range r.Plan.Sources {
		add(s.Name)
	}
	for _, s := range r.Plan.DrainSources {
		add(s.Name)
	}
	return cs
}

// chart draws latency percentiles per load and source (log scale) above
// the drain rates, as a PNG.
func (r *report) chart() ([]byte, error) {
	const (
		W      = 1400
		left   = 110
		right  = W - 30
		top1   = 90
		bottom = 610
	)
	const rowH = 46
	H := bottom + 90 + max(1, len(r.Drains))*rowH + 30
	img := image.NewRGBA(image.Rect(0, 0, W, H))
	fill(img, 0, 0, W, H, white)
	colors := r.sourceColors()

	drawText(img, left, 20, "outboxd vs Debezium vs polling - end-to-end latency, ms (log scale)", 3, black)
	drawText(img, left, 55, fmt.Sprintf("commit return to consumer receipt, median of the rounds. bar: p50, lighter: p95, lightest: p99. %s, load avg %.1f-%.1f",
		r.Started.Format("2006-01-02"), r.Machine.LoadStart, r.Machine.LoadEnd), 2, grey)

	// Latency panel: log10 axis over whole decades around the data.
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, c := range r.Latency {
		if c.Err == "" && c.P50Ms > 0 {
			lo, hi = math.Min(lo, c.P50Ms), math.Max(hi, c.P99Ms)
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 1, 100
	}
	dlo, dhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if dhi <= dlo {
		dhi = dlo + 1
	}
	y := func(v float64) int {
		v = math.Max(v, math.Pow(10, dlo))
		f := (math.Log10(v) - dlo) / (dhi - dlo)
		return bottom - int(f*float64(bottom-top1))
	}
	for d := dlo; d <= dhi; d++ {
		yy := y(math.Pow(10, d))
		fill(img, left, yy, right-left, 1, grid)
		label := fmt.Sprintf("%g", math.Pow(10, d))
		drawText(img, left-12-textWidth(label, 2), yy-7, label, 2, black)
	}
	drawTextUp(img, 18, (top1+bottom)/2+60, "latency ms", 2, black)
	fill(img, left, top1, 1, bottom-top1, black)
	fill(img, left, bottom, right-left, 1, black)

	loads := r.Plan.Loads
	if n := len(loads); n > 0 {
		groupW := (right - left) / n
		barW := groupW * 8 / 10 / max(1, len(r.Plan.Sources))
		for gi, l := range loads {
			gx := left + gi*groupW + groupW/10
			for si, s := range r.Plan.Sources {
				bx := gx + si*barW
				c := r.median(s.Name, l)
				if c == nil {
					drawText(img, bx+4, bottom-20, "x", 2, black)
					continue
				}
				col := colors[s.Name]
				fill(img, bx+2, y(c.P99Ms), barW-4, bottom-y(c.P99Ms), tint(col, 0.75))
				fill(img, bx+2, y(c.P95Ms), barW-4, bottom-y(c.P95Ms), tint(col, 0.45))
				fill(img, bx+2, y(c.P50Ms), barW-4, bottom-y(c.P50Ms), col)
				v := short(c.P50Ms)
				scale := 2
				if textWidth(v, 2) > barW {
					scale = 1
				}
				drawText(img, bx+barW/2-textWidth(v, scale)/2, y(c.P99Ms)-8*scale-2, v, scale, black)
			}
			l1, l2 := fmt.Sprintf("%d ev/s", l.Rate), fmt.Sprintf("%d row/tx", l.TxRows)
			cx := left + gi*groupW + groupW/2
			drawText(img, cx-textWidth(l1, 2)/2, bottom+10, l1, 2, black)
			drawText(img, cx-textWidth(l2, 2)/2, bottom+30, l2, 2, black)
		}
	}
	// Legend.
	lx := left + 20
	for _, s := range r.Plan.Sources {
		fill(img, lx, top1+8, 18, 14, colors[s.Name])
		drawText(img, lx+24, top1+8, s.Name, 2, black)
		lx += 24 + textWidth(s.Name, 2) + 30
	}

	// Drain panel: horizontal bars.
	top2 := bottom + 90
	drawText(img, left, top2-30, fmt.Sprintf("backlog drain: %d rows preloaded, events/s until all in Kafka (ceiling: reader, no Kafka)", r.Plan.DrainRows), 2, black)
	if len(r.Drains) > 0 {
		maxRate := 1.0
		for _, d := range r.Drains {
			maxRate = math.Max(maxRate, d.EventsPerSec)
		}
		labelW := 0
		for _, d := range r.Drains {
			labelW = max(labelW, textWidth(d.Source, 2))
		}
		x0 := 20 + labelW + 16
		x1 := right - 200
		for i, d := range r.Drains {
			yy := top2 + i*rowH
			drawText(img, x0-16-textWidth(d.Source, 2), yy+rowH/2-7, d.Source, 2, black)
			if d.Err != "" {
				drawText(img, x0, yy+rowH/2-7, "failed", 2, black)
				continue
			}
			w := int(float64(x1-x0) * d.EventsPerSec / maxRate)
			fill(img, x0, yy+6, max(1, w), rowH-12, colors[d.Source])
			v := fmt.Sprintf("%.0f/s", d.EventsPerSec)
			if d.Source != ceilingName && d.PctCeiling > 0 {
				v += fmt.Sprintf(" (%.0f%%)", d.PctCeiling)
			}
			drawText(img, x0+w+10, yy+rowH/2-7, v, 2, black)
		}
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func short(v float64) string {
	switch {
	case v < 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}
