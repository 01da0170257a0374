package main

// The chart of a report (bench.png, and network.png through chartReport),
// drawn with gonum/plot: latency per load and source on a log axis, with a
// legend beside it, above the backlog drain rates.

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

var (
	grey = color.RGBA{120, 120, 120, 255}
	// palette is Tableau's ten (grey left out) and four more, so that the
	// network chart's source × round trip bars repeat no colour.
	palette = []color.RGBA{{31, 119, 180, 255}, {255, 127, 14, 255}, {44, 160, 44, 255}, {148, 103, 189, 255},
		{140, 86, 75, 255}, {227, 119, 194, 255}, {188, 189, 34, 255}, {23, 190, 207, 255}, {214, 39, 40, 255},
		{0, 60, 120, 255}, {150, 120, 0, 255}, {0, 120, 90, 255}, {100, 30, 110, 255}, {255, 187, 120, 255}}
)

// The chart's size in points, at chartDPI: 1400 pixels wide.
const (
	chartDPI     = 96
	chartWidth   = vg.Length(1050)
	latencyH     = vg.Length(480)
	legendW      = vg.Length(210)
	drainRowH    = vg.Length(30)
	drainMarginH = vg.Length(90)
	chartMargin  = vg.Length(12)
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
		if strings.HasPrefix(name, ceilingName) { // network.png's have the round trip after it
			cs[name] = grey
		} else if _, ok := cs[name]; !ok {
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

// chart draws the latency panel, its legend to the right, and the drain
// panel below, as a PNG.
func (r *report) chart() ([]byte, error) {
	colors := r.sourceColors()
	drainH := drainMarginH + drainRowH*vg.Length(max(1, len(r.Drains)))
	img := vgimg.NewWith(vgimg.UseWH(chartWidth, latencyH+drainH), vgimg.UseDPI(chartDPI))
	dc := draw.Crop(draw.New(img), chartMargin, -chartMargin, chartMargin, -chartMargin)
	top := draw.Crop(dc, 0, 0, drainH-chartMargin, 0)
	r.latencyPlot(colors).Draw(draw.Crop(top, 0, -legendW, 0, 0))
	r.legend(colors).Draw(draw.Crop(top, chartWidth-legendW, 0, 0, -40))
	r.drainPlot(colors).Draw(draw.Crop(dc, 0, 0, 0, -(latencyH + chartMargin)))
	var buf bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// latencyPlot is p50, p95 and p99 per load (groups) and source (bars),
// on whole decades around the data.
func (r *report) latencyPlot(colors map[string]color.RGBA) *plot.Plot {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("End-to-end latency: commit return to consumer receipt, median of the rounds\n"+
		"bar p50 (value on top), lighter p95, lightest p99; %s, load average %.1f-%.1f",
		r.Started.Format("2006-01-02"), r.Machine.LoadStart, r.Machine.LoadEnd)
	p.Title.TextStyle.Font.Size = 13
	p.Y.Label.Text = "latency, ms (log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = decades{}
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
	p.Y.Min, p.Y.Max = math.Pow(10, dlo), math.Pow(10, dhi)
	grid := plotter.NewGrid()
	grid.Vertical.Color = nil
	p.Add(grid)
	if len(r.Plan.Loads) > 0 {
		var names []string
		for _, l := range r.Plan.Loads {
			names = append(names, fmt.Sprintf("%d ev/s\n%d row/tx", l.Rate, l.TxRows))
		}
		p.NominalX(names...)
		p.X.Min, p.X.Max = -0.5, float64(len(names))-0.5
		p.Add(latencyBars{r: r, colors: colors})
	}
	return p
}

// legend names each latency source's colour.
func (r *report) legend(colors map[string]color.RGBA) *plot.Legend {
	l := plot.NewLegend()
	l.Top, l.Left = true, true
	l.ThumbnailWidth = 14
	l.Padding = 2
	for _, s := range r.Plan.Sources {
		l.Add(s.Name, swatch{colors[s.Name]})
	}
	return &l
}

// swatch is a legend's colour square.
type swatch struct{ c color.Color }

func (s swatch) Thumbnail(c *draw.Canvas) {
	c.FillPolygon(s.c, rect(c.Min.X, c.Min.Y, c.Max.X, c.Max.Y))
}

func rect(x0, y0, x1, y1 vg.Length) []vg.Point {
	return []vg.Point{{X: x0, Y: y0}, {X: x1, Y: y0}, {X: x1, Y: y1}, {X: x0, Y: y1}}
}

// latencyBars draws one group of bars per load at x = 0, 1, ..., one bar
// per source, each p99 behind p95 behind p50 from the axis up, and the p50
// value above it; "x" where a source has no cell at that load.
type latencyBars struct {
	r      *report
	colors map[string]color.RGBA
}

func (b latencyBars) Plot(c draw.Canvas, plt *plot.Plot) {
	trX, trY := plt.Transforms(&c)
	y := func(v float64) vg.Length { return trY(math.Min(math.Max(v, plt.Y.Min), plt.Y.Max)) }
	srcs := b.r.Plan.Sources
	groupW := (trX(1) - trX(0)) * 0.85
	barW := groupW / vg.Length(max(1, len(srcs)))
	label := plt.X.Tick.Label
	label.XAlign, label.YAlign = draw.XCenter, draw.YBottom
	label.Font.Size = 10
	for gi, l := range b.r.Plan.Loads {
		x0 := trX(float64(gi)) - groupW/2
		for si, s := range srcs {
			bx := x0 + barW*vg.Length(si)
			mid := vg.Point{X: bx + barW/2, Y: c.Min.Y + 2}
			cell := b.r.median(s.Name, l)
			if cell == nil {
				c.FillText(label, mid, "x")
				continue
			}
			col := b.colors[s.Name]
			for _, layer := range []struct {
				v    float64
				tint float64
			}{{cell.P99Ms, 0.75}, {cell.P95Ms, 0.45}, {cell.P50Ms, 0}} {
				c.FillPolygon(tint(col, layer.tint), rect(bx+1, c.Min.Y, bx+barW-1, y(layer.v)))
			}
			mid.Y = y(cell.P99Ms) + 2
			c.FillText(label, mid, short(cell.P50Ms))
		}
	}
}

// drainPlot is one horizontal bar per drain, in events/s, labelled with
// the rate and its share of the ceiling.
func (r *report) drainPlot(colors map[string]color.RGBA) *plot.Plot {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Backlog drain: %d rows preloaded, events/s until all are in Kafka (ceiling: the reader alone, no Kafka)", r.Plan.DrainRows)
	p.Title.TextStyle.Font.Size = 13
	p.X.Label.Text = "events/s"
	p.X.Tick.Marker = thousands{}
	maxRate := 1.0
	for _, d := range r.Drains {
		maxRate = math.Max(maxRate, d.EventsPerSec)
	}
	p.X.Min, p.X.Max = 0, maxRate*1.2
	if n := len(r.Drains); n > 0 {
		names := make([]string, n)
		for i, d := range r.Drains {
			names[n-1-i] = d.Source // the first drain on top
		}
		p.NominalY(names...)
		p.Y.Min, p.Y.Max = -0.5, float64(n)-0.5
		p.Add(drainBars{r: r, colors: colors})
	} else {
		p.HideY()
	}
	return p
}

// drainBars draws the drains top down at y = n-1, ..., 0.
type drainBars struct {
	r      *report
	colors map[string]color.RGBA
}

func (b drainBars) Plot(c draw.Canvas, plt *plot.Plot) {
	trX, trY := plt.Transforms(&c)
	label := plt.Y.Tick.Label
	label.XAlign, label.YAlign = draw.XLeft, draw.YCenter
	n := len(b.r.Drains)
	for i, d := range b.r.Drains {
		at := float64(n - 1 - i)
		if d.Err != "" {
			c.FillText(label, vg.Point{X: trX(0) + 6, Y: trY(at)}, "failed")
			continue
		}
		x1 := max(trX(d.EventsPerSec), trX(0)+1)
		c.FillPolygon(b.colors[d.Source], rect(trX(0), trY(at-0.32), x1, trY(at+0.32)))
		v := fmt.Sprintf("%.0f/s", d.EventsPerSec)
		if d.Source != ceilingName && d.PctCeiling > 0 {
			v += fmt.Sprintf(" (%.0f%% of the ceiling)", d.PctCeiling)
		}
		c.FillText(label, vg.Point{X: x1 + 6, Y: trY(at)}, v)
	}
}

// decades are the ticks of a log axis: 1, 10, 100, ... labelled, 2-9
// between them not.
type decades struct{}

func (decades) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for d := math.Floor(math.Log10(lo)); d <= math.Ceil(math.Log10(hi)); d++ {
		v := math.Pow(10, d)
		ticks = append(ticks, plot.Tick{Value: v, Label: fmt.Sprintf("%g", v)})
		for i := 2.0; i < 10; i++ {
			ticks = append(ticks, plot.Tick{Value: i * v})
		}
	}
	return ticks
}

// thousands are the default ticks labelled 50k, 100k, ...
type thousands struct{}

func (thousands) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i, t := range ticks {
		if t.Label != "" && t.Value >= 1000 {
			ticks[i].Label = fmt.Sprintf("%gk", t.Value/1000)
		}
	}
	return ticks
}

func short(v float64) string {
	switch {
	case v < 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}
