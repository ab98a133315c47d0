package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"os"
	"strconv"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// bar is one labelled value of a chart panel.
type bar struct {
	label string
	value float64
	note  string // printed after the value
}

// panel is one titled group of bars drawn on a shared linear scale.
type panel struct {
	title string
	unit  string
	bars  []bar
}

// chartPanels turns the run's results into the chart's panels: orders/s of every
// throughput measurement, events/s of the relays, and latency percentiles per offered load.
func chartPanels(results []result) []panel {
	get := func(r result, k string) (string, bool) {
		for _, kv := range r.fields {
			if kv[0] == k {
				return kv[1], true
			}
		}
		return "", false
	}
	num := func(r result, k string) float64 {
		v, _ := get(r, k)
		f, _ := strconv.ParseFloat(v, 64)
		return f
	}
	orders := panel{title: "Throughput (orders/s, higher is better)", unit: "orders/s"}
	events := panel{title: "Outbox relay into Kafka (events/s)", unit: "events/s"}
	lat := panel{title: "End-to-end latency, p99 (ms, lower is better)", unit: "ms"}
	for _, r := range results {
		if _, ok := get(r, "round"); ok {
			continue // one round of several: the chart shows their medians
		}
		mode, _ := get(r, "mode")
		if spt, ok := get(r, "steps_per_tx"); ok && mode == "" {
			mode = "single, steps/tx " + spt
		}
		switch r.name {
		case "unsafe", "inbox", "naive":
			if mode == "" {
				mode = "single"
			}
			note := ""
			if d, ok := get(r, "duplicates"); ok {
				note = d + " duplicates"
			}
			if o, ok := get(r, "overhead_pct_vs_unsafe"); ok {
				note = "overhead " + o + " %"
			}
			orders.bars = append(orders.bars, bar{r.name + " (" + mode + ")", num(r, "orders_per_s"), note})
		case "storm":
			if sec := num(r, "seconds"); sec > 0 {
				o, _ := get(r, "orders")
				k, _ := get(r, "deliveries_each")
				orders.bars = append(orders.bars, bar{"storm (" + o + " orders x " + k + ")", num(r, "orders") / sec, "orders/s absorbed"})
			}
		case "e2e":
			if load, ok := get(r, "offered_per_s"); ok {
				lat.bars = append(lat.bars, bar{fmt.Sprintf("e2e %s at %s/s", mode, load), num(r, "p99_ms"),
					fmt.Sprintf("p50 %.0f ms, achieved %.0f/s", num(r, "p50_ms"), num(r, "orders_per_s"))})
			} else {
				orders.bars = append(orders.bars, bar{"e2e (" + mode + ")", num(r, "orders_per_s"), "exactly once"})
			}
		case "relay", "watermill_forwarder":
			label := r.name
			if mode != "" {
				label += " (" + mode + ")"
			}
			events.bars = append(events.bars, bar{label, num(r, "events_per_s"), ""})
		}
	}
	var out []panel
	for _, p := range []panel{orders, events, lat} {
		if len(p.bars) > 0 {
			out = append(out, p)
		}
	}
	return out
}

// writeChart draws the panels as one PNG.
func writeChart(path string, panels []panel) error {
	const (
		width    = 1100
		labelW   = 330
		barH     = 18
		gap      = 6
		titleH   = 34
		marginR  = 260
		marginTB = 16
	)
	height := marginTB * 2
	for _, p := range panels {
		height += titleH + len(p.bars)*(barH+gap) + 10
	}
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	draw.Draw(img, img.Bounds(), image.NewUniform(color.White), image.Point{}, draw.Src)
	ink := color.RGBA{30, 30, 30, 255}
	colors := []color.RGBA{{52, 101, 164, 255}, {78, 154, 6, 255}, {204, 0, 0, 255}}
	text := func(x, y int, s string) {
		d := &font.Drawer{Dst: img, Src: image.NewUniform(ink), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
		d.DrawString(s)
	}
	y := marginTB
	for i, p := range panels {
		text(10, y+20, p.title)
		y += titleH
		maxV := 0.0
		for _, b := range p.bars {
			maxV = max(maxV, b.value)
		}
		if maxV == 0 {
			maxV = 1
		}
		for _, b := range p.bars {
			text(10, y+13, b.label)
			w := int(b.value / maxV * float64(width-labelW-marginR))
			draw.Draw(img, image.Rect(labelW, y, labelW+max(w, 1), y+barH), image.NewUniform(colors[i%len(colors)]), image.Point{}, draw.Src)
			v := strconv.FormatFloat(b.value, 'f', 0, 64) + " " + p.unit
			if b.note != "" {
				v += "  " + b.note
			}
			text(labelW+max(w, 1)+6, y+13, v)
			y += barH + gap
		}
		y += 10
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
