package e2e

// The launcher of the applistener child processes, whatever their command
// (serve, gateway, edge, dev, routes, instances): launch starts one with its
// output collected, waits until it is ready, starts again after a lost port
// race, and on cleanup stops it (SIGTERM, then SIGKILL) and prints its
// output if the test failed. The harnesses (startProc, startSupervisor,
// launchReady, ...) wrap it with their flags and readiness rules.

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

const (
	// launchAttempts bounds the starts of launch when each one loses a port
	// race.
	launchAttempts = 5
	// stopTimeout is how long stop waits after SIGTERM before killing.
	stopTimeout = 15 * time.Second
)

// launchSpec describes a child process for launch.
type launchSpec struct {
	// name names the process in failures and in the output printed when
	// the test failed ("applistener", "gateway", "edge").
	name string
	// args returns the arguments of one start. It is called again after a
	// lost port race, so it can pick new addresses (and record them where
	// ready finds them).
	args func() []string
	// env is the environment of the process; nil is this process's.
	env []string
	// output collects stdout and stderr; a new buffer when nil. A process
	// restarted on the same ports passes one that spans its runs.
	output *syncBuffer
	// setup runs on each start before Start (a stdin pipe, stdout taken
	// elsewhere).
	setup func(cmd *exec.Cmd)
	// ready reports that the process is ready (/readyz 200, an address
	// answering). It is polled until it holds; the start fails when the
	// process exits first or waitTimeout passes. nil: started is ready.
	ready func(p *process) bool
	// retryPortRace: when the process exits before it is ready saying
	// "address already in use" (a parallel test took a port between
	// freeAddr and the bind), start again, launchAttempts times at most.
	retryPortRace bool
	// detail adds to the failure when the process does not become ready
	// (its /readyz answer).
	detail func(p *process) string
	// exit is what stop checks of the exit code.
	exit exitCheck
	// noCleanup: launch registers no cleanup; the caller stops the process
	// and prints its output (a gateway restarted on the same ports does it
	// once for all its runs).
	noCleanup bool
}

// exitCheck is what stop checks of a process's exit code.
type exitCheck int

const (
	// exitZeroIfStopped: 0 when stop's SIGTERM ended the process; one that
	// ended before is the test's business (it killed it).
	exitZeroIfStopped exitCheck = iota
	// exitZero: 0, also when the process ended before stop.
	exitZero
	// exitAny: nothing.
	exitAny
)

// argv is a launchSpec.args that returns args every time.
func argv(args ...string) func() []string { return func() []string { return args } }

// process is a running (or ended) child process started by launch.
type process struct {
	name string
	args []string
	cmd  *exec.Cmd
	// stderr collects stdout and stderr (from mark on: this run's).
	stderr *syncBuffer
	mark   int
	exit   exitCheck

	done     chan struct{} // closed when the process has exited
	waitErr  error         // set before done is closed
	exitCode int           // set before done is closed
}

// launch starts the binary as spec describes and waits until it is ready.
// Unless spec.noCleanup, the process is stopped on cleanup (see stop) and
// its output is printed if the test failed.
func launch(t testing.TB, spec launchSpec) *process {
	t.Helper()
	for attempt := 1; ; attempt++ {
		p := spec.start(t)
		if spec.ready == nil || p.waitReady(spec.ready) {
			if !spec.noCleanup {
				t.Cleanup(func() {
					p.stop(t)
					if t.Failed() {
						t.Logf("%s output:\n%s", p.name, p.output())
					}
				})
			}
			return p
		}
		exited := p.exited()
		detail := ""
		if spec.detail != nil {
			detail = ", " + spec.detail(p)
		}
		p.kill()
		if exited && spec.retryPortRace && attempt < launchAttempts && strings.Contains(p.output(), "address already in use") {
			continue // lost a port race with a parallel test: args picks new ports
		}
		t.Fatalf("%s did not become ready (exited=%v, err=%v%s)\nargs: %q\noutput:\n%s",
			p.name, exited, p.waitErr, detail, p.args, p.output())
	}
}

// start starts the process once.
func (spec launchSpec) start(t testing.TB) *process {
	t.Helper()
	out := spec.output
	if out == nil {
		out = &syncBuffer{}
	}
	p := &process{
		name: spec.name, args: spec.args(), stderr: out, mark: len(out.String()),
		exit: spec.exit, done: make(chan struct{}),
	}
	p.cmd = exec.Command(binPath, p.args...)
	p.cmd.Env = spec.env
	p.cmd.Stdout, p.cmd.Stderr = out, out
	if spec.setup != nil {
		spec.setup(p.cmd)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		p.exitCode = p.cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	return p
}

// waitReady polls ready every 20 ms until it holds (true), the process
// exits or waitTimeout passes (false).
func (p *process) waitReady(ready func(*process) bool) bool {
	deadline := time.Now().Add(waitTimeout)
	for {
		if p.exited() {
			return false
		}
		if ready(p) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-p.done:
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// output is what the process wrote in this run.
func (p *process) output() string { return p.stderr.String()[p.mark:] }

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitExit waits up to timeout for the process to exit and reports
// whether it did.
func (p *process) waitExit(timeout time.Duration) bool {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.done:
		return true
	case <-timer.C:
		return false
	}
}

// signalAndWait sends sig and returns how long the process took to exit,
// failing the test if it did not exit within timeout.
func (p *process) signalAndWait(t testing.TB, sig syscall.Signal, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
	if !p.waitExit(timeout) {
		p.kill()
		t.Fatalf("%s did not exit within %v of %v", p.name, timeout, sig)
	}
	return time.Since(start)
}

// stop ends the process with SIGTERM, killing it after stopTimeout, and
// checks its exit code as p.exit says.
func (p *process) stop(t testing.TB) {
	how := "by itself"
	if !p.exited() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		if !p.waitExit(stopTimeout) {
			t.Errorf("%s did not exit within %v of SIGTERM; killing it", p.name, stopTimeout)
			p.kill()
			return
		}
		how = "after SIGTERM"
	} else if p.exit == exitZeroIfStopped {
		return
	}
	if p.exit != exitAny && p.exitCode != 0 {
		t.Errorf("%s exited with %d %s (%v)", p.name, p.exitCode, how, p.waitErr)
	}
}

// kill ends the process with SIGKILL and waits for it.
func (p *process) kill() {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// childEnv is the environment of the child processes that take it: without
// GORACE set, a binary built with -race (APPLISTENER_E2E_RACE=1) does not
// add its default one-second sleep at exit, so exit latencies stay
// meaningful.
func childEnv() []string {
	env := os.Environ()
	if _, ok := os.LookupEnv("GORACE"); !ok {
		env = append(env, "GORACE=atexit_sleep_ms=0")
	}
	return env
}

// runBin runs the binary with args (childEnv, stdin as its standard input)
// until it exits, and returns its stdout, its stderr and its exit code.
func runBin(t testing.TB, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out syncBuffer
	p := launch(t, launchSpec{
		name: fmt.Sprintf("%q", args),
		args: argv(args...),
		env:  childEnv(),
		setup: func(cmd *exec.Cmd) {
			cmd.Stdin = strings.NewReader(stdin)
			cmd.Stdout = &out
		},
		noCleanup: true,
	})
	<-p.done
	return out.String(), p.output(), p.exitCode
}

// lineWriter delivers each line written to it (without its "\n" or
// "\r\n") on lines; flush delivers an unterminated last line.
type lineWriter struct {
	lines chan<- string
	buf   []byte
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.buf = append(w.buf, b...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		w.lines <- string(bytes.TrimSuffix(w.buf[:i], []byte("\r")))
		w.buf = w.buf[i+1:]
	}
}

func (w *lineWriter) flush() {
	if len(w.buf) > 0 {
		w.lines <- string(bytes.TrimSuffix(w.buf, []byte("\r")))
		w.buf = nil
	}
}
