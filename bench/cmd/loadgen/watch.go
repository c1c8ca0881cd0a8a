package main

import (
	"flag"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// clockTicks is USER_HZ, 100 on every Linux this runs on.
const clockTicks = 100

// watcher samples the CPU time (user+system) of the proxy's processes over
// exactly the measured window.
type watcher struct {
	mu   sync.Mutex
	pids []int
	t0   time.Time
	c0   int64
}

func watchFlag(fs *flag.FlagSet) *string {
	return fs.String("watch", "", "comma-separated PIDs whose CPU time is reported over the measured window")
}

func newWatcher(list string) *watcher {
	w := &watcher{}
	for _, s := range strings.Split(list, ",") {
		if p, err := strconv.Atoi(strings.TrimSpace(s)); err == nil {
			w.pids = append(w.pids, p)
		}
	}
	return w
}

func (w *watcher) ticks() int64 {
	var sum int64
	for _, p := range w.pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(p) + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		// After the command: state is field 3, utime 14, stime 15.
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		sum += u + st
	}
	return sum
}

func (w *watcher) start() {
	if w == nil || len(w.pids) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t0, w.c0 = time.Now(), w.ticks()
}

// stop adds watch_cpu_s and watch_cpu_pct to out.
func (w *watcher) stop(out map[string]any) {
	if w == nil || len(w.pids) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.t0.IsZero() {
		return
	}
	cpu := float64(w.ticks()-w.c0) / clockTicks
	wall := time.Since(w.t0).Seconds()
	out["watch_cpu_s"] = round(cpu, 3)
	out["watch_cpu_pct"] = round(cpu/wall*100, 1)
	out["watch_wall_s"] = round(wall, 3)
}
