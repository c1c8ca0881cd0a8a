package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// catchHangup catches SIGHUP for a long-running command (serve, gateway,
// edge) from its first line on: the signal's default action would end the
// process. Each SIGHUP arrives on the channel (a burst counts once); stop
// stops catching.
func catchHangup() (hup <-chan os.Signal, stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	return ch, func() { signal.Stop(ch) }
}

// onHangup runs reload on every signal from hup until ctx ends, in a
// goroutine owned by wg, and logs what it did: what names what is
// re-read; a failed reload keeps what was loaded before. A nil hup: none.
func onHangup(ctx context.Context, wg *sync.WaitGroup, hup <-chan os.Signal, logger *slog.Logger, what string, reload func() error) {
	if hup == nil {
		return
	}
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				logger.Info("SIGHUP: reloading", "what", what)
				if err := reload(); err != nil {
					logger.Error("SIGHUP: reload failed; keeping what was loaded before", "what", what, "err", err)
					continue
				}
				logger.Info("SIGHUP: reloaded", "what", what)
			}
		}
	})
}
