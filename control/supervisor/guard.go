package supervisor

import (
	"context"

	"github.com/applistener/applistener/internal/panicguard"
)

// guardedPush is push behind panicguard (SupervisorSession): a panic
// ends that one session as a failure, which Run retries after its
// backoff; the process and the routes it holds go on.
func (c *GatewayClient) guardedPush(ctx context.Context, endpoint string) (accepted bool, err error) {
	err = panicguard.Call(c.Logger, panicguard.SupervisorSession, c.SupervisorID, func() error {
		var perr error
		accepted, perr = c.push(ctx, endpoint)
		return perr
	}, "supervisor", c.SupervisorID, "endpoint", endpoint, "source", "push")
	return accepted, err
}

// guardedPoll is poll behind panicguard (SupervisorSession): a panic is
// one failed poll.
func (c *GatewayClient) guardedPoll(ctx context.Context, endpoint, source string) error {
	return panicguard.Call(c.Logger, panicguard.SupervisorSession, c.SupervisorID, func() error {
		return c.poll(ctx, endpoint, source)
	}, "supervisor", c.SupervisorID, "endpoint", endpoint, "source", source)
}
