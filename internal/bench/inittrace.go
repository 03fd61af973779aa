package main

import (
	"bufio"
	"bytes"
	"cmp"
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
)

// initRuns is how many times initByModule runs withlock version.
const initRuns = 21

// initByModule prints what package initialisation costs every withlock
// start, by module: GODEBUG=inittrace=1 withlock version, the clock time
// of each package's init summed by the module that holds it (found in the
// binary's build information), median of initRuns runs. Go has no lazy
// package initialisation, so a driver's init is paid by every invocation,
// whatever its backend (docs/design.md).
func initByModule(wl string) error {
	info, err := buildinfo.ReadFile(wl)
	if err != nil {
		return err
	}
	modules := []string{info.Main.Path}
	for _, d := range info.Deps {
		modules = append(modules, d.Path)
	}
	moduleOf := func(pkg string) string {
		best := ""
		for _, m := range modules {
			if (pkg == m || strings.HasPrefix(pkg, m+"/")) && len(m) > len(best) {
				best = m
			}
		}
		if best == "" {
			return "Go's standard library and runtime"
		}
		return best
	}
	runs := map[string][]float64{}
	var totals []float64
	for range initRuns {
		cmd := exec.Command(wl, "version")
		var trace bytes.Buffer
		cmd.Env, cmd.Stderr = append(os.Environ(), "GODEBUG=inittrace=1"), &trace
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s version: %v\n%s", wl, err, trace.Bytes())
		}
		// "init PKG @0.25 ms, 0.82 ms clock, 0 bytes, 0 allocs": f[4] is the clock
		sums, total := map[string]float64{}, 0.0
		for sc := bufio.NewScanner(&trace); sc.Scan(); {
			f := strings.Fields(sc.Text())
			if len(f) < 7 || f[0] != "init" || f[6] != "clock," {
				continue
			}
			clock, err := strconv.ParseFloat(f[4], 64)
			if err != nil {
				continue
			}
			sums[moduleOf(f[1])] += clock
			total += clock
		}
		for m := range sums {
			runs[m] = append(runs[m], sums[m])
		}
		totals = append(totals, total)
	}
	median := func(xs []float64) float64 {
		for len(xs) < initRuns {
			xs = append(xs, 0) // a run in which the module's inits took no time
		}
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	type row struct {
		module string
		ms     float64
	}
	var rows []row
	for m, xs := range runs {
		rows = append(rows, row{m, median(xs)})
	}
	slices.SortFunc(rows, func(a, b row) int {
		if a.ms != b.ms {
			return cmp.Compare(b.ms, a.ms)
		}
		return strings.Compare(a.module, b.module)
	})
	fmt.Printf("## Package initialisation in every start: `GODEBUG=inittrace=1 withlock version`, by module (median of %d runs)\n\n", initRuns)
	fmt.Println("| module | init, clock ms |")
	fmt.Println("|---|---:|")
	for _, r := range rows {
		if r.ms >= 0.05 {
			fmt.Printf("| %s | %.2f |\n", r.module, r.ms)
		}
	}
	fmt.Printf("| all (a module's median need not add up to this one) | %.2f |\n\n", median(totals))
	return nil
}
