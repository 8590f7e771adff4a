package main

import (
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"runtime"
	"strings"
	"time"
)

// Chart geometry: two panels side by side, calls/s (linear) and p99
// latency (log), concurrency on both x axes.
const (
	chartW   = 1000
	chartH   = 430
	panelW   = 400
	panelH   = 280
	panelTop = 90
	leftA    = 80
	leftB    = leftA + panelW + 100
)

var colors = map[string]string{
	"dabb": "#d62728", "dabb-idem": "#e377c2", "grpc": "#1f77b4", "rpcx": "#2ca02c", "netrpc": "#9467bd", "kitex": "#ff7f0e", "kitex-pool": "#bcbd22", "raw": "#555555", "raw-conn": "#aaaaaa",
}

func esc(s string) string {
	var b strings.Builder
	xml.EscapeText(&b, []byte(s))
	return b.String()
}

// series is one framework's line: y values by concurrency index, NaN for
// missing points.
type series struct {
	name string
	ys   []float64
}

func writeSVG(w io.Writer, res *results) error {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		chartW, chartH, chartW, chartH)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", chartW, chartH)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", leftA,
		esc(fmt.Sprintf("%s echo, one shared client, server in its own process (%s, %d CPUs)",
			payloadDesc(res.cfg.payload), res.start.Format("2006-01-02"), runtime.NumCPU())))

	var rates, p99s []series
	for _, f := range res.cfg.frameworks {
		r := series{name: f.Name}
		l := series{name: f.Name}
		for _, c := range res.cfg.conc {
			p, ok := res.find(f.Name, c)
			if !ok {
				r.ys, l.ys = append(r.ys, math.NaN()), append(l.ys, math.NaN())
				continue
			}
			r.ys = append(r.ys, p.rate())
			l.ys = append(l.ys, float64(p.P99)/float64(time.Millisecond))
		}
		rates, p99s = append(rates, r), append(p99s, l)
	}
	labels := make([]string, len(res.cfg.conc))
	for i, c := range res.cfg.conc {
		labels[i] = fmt.Sprintf("%d", c)
	}
	panel(&b, leftA, "calls/s (higher is better)", labels, rates, false)
	panel(&b, leftB, "p99 latency, ms, log scale (lower is better)", labels, p99s, true)

	// Legend.
	x := leftA
	for _, s := range rates {
		fmt.Fprintf(&b, `<line x1="%d" y1="48" x2="%d" y2="48" stroke="%s" stroke-width="3"%s/>`, x, x+24, color(s.name), dash(s.name))
		fmt.Fprintf(&b, `<text x="%d" y="52">%s</text>`+"\n", x+30, esc(s.name))
		x += 40 + 8*len(s.name) + 20
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// color returns the line color of framework name: a TLS variant's is
// its plaintext framework's.
func color(name string) string {
	if c, ok := colors[strings.TrimSuffix(name, "-tls")]; ok {
		return c
	}
	return "#8c564b"
}

// dash returns the stroke pattern of framework name's line: dashed for
// the raw references, dotted for a TLS variant, solid for the rest.
func dash(name string) string {
	switch {
	case name == "raw" || name == "raw-conn":
		return ` stroke-dasharray="6 4"`
	case strings.HasSuffix(name, "-tls"):
		return ` stroke-dasharray="2 3"`
	}
	return ""
}

// panel draws one panel at x offset left: axes, grid, title and lines.
func panel(b *strings.Builder, left int, title string, xlabels []string, ss []series, logY bool) {
	top, bottom := panelTop, panelTop+panelH
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range ss {
		for _, y := range s.ys {
			if !math.IsNaN(y) && y > 0 {
				lo, hi = math.Min(lo, y), math.Max(hi, y)
			}
		}
	}
	if math.IsInf(lo, 0) {
		lo, hi = 1, 10
	}
	var ticks []float64
	var ymap func(float64) float64
	if logY {
		a, z := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
		if z <= a {
			z = a + 1
		}
		for e := a; e <= z; e++ {
			ticks = append(ticks, math.Pow(10, e))
		}
		ymap = func(y float64) float64 {
			return float64(bottom) - (math.Log10(y)-a)/(z-a)*float64(panelH)
		}
	} else {
		step := niceStep(hi / 5)
		top := math.Ceil(hi/step) * step
		for v := 0.0; v <= top+step/2; v += step {
			ticks = append(ticks, v)
		}
		ymap = func(y float64) float64 { return float64(bottom) - y/top*float64(panelH) }
	}
	n := len(xlabels)
	xmap := func(i int) float64 { return float64(left) + (float64(i)+0.5)*float64(panelW)/float64(n) }

	fmt.Fprintf(b, `<text x="%d" y="%d" font-weight="bold">%s</text>`+"\n", left, top-12, esc(title))
	for _, t := range ticks {
		y := ymap(t)
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`, left, y, left+panelW, y)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y+4, esc(tickLabel(t, logY)))
	}
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>`+"\n", left, top, panelW, panelH)
	for i, l := range xlabels {
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", xmap(i), bottom+18, esc(l))
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">concurrency (goroutines sharing one client)</text>`+"\n",
		left+panelW/2, bottom+38)
	for _, s := range ss {
		var pts []string
		for i, y := range s.ys {
			if math.IsNaN(y) || (logY && y <= 0) {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xmap(i), ymap(y)))
		}
		if len(pts) == 0 {
			continue
		}
		width := 2
		if s.name == "dabb" {
			width = 3
		}
		fmt.Fprintf(b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="%d"%s/>`+"\n",
			strings.Join(pts, " "), color(s.name), width, dash(s.name))
		for _, p := range pts {
			x, y, _ := strings.Cut(p, ",")
			fmt.Fprintf(b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`, x, y, color(s.name))
		}
		b.WriteString("\n")
	}
}

// niceStep rounds v up to 1, 2 or 5 times a power of ten.
func niceStep(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func tickLabel(v float64, logY bool) string {
	if logY {
		return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", v), "0"), ".")
	}
	if v >= 1000 {
		return fmt.Sprintf("%gk", v/1000)
	}
	return fmt.Sprintf("%g", v)
}
