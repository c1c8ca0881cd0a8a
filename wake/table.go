package wake

import (
	"context"

	"github.com/applistener/applistener/routes"
)

// KeyOf returns the wake key of a route's instance.
func KeyOf(r *routes.Route) Key {
	return Key{Workspace: r.Workspace, Sandbox: r.Sandbox, Generation: r.Generation}
}

// FollowTable releases the wakes whose instance becomes active in t: after
// every change of the table it calls Sync with the instances that have a
// route not sleeping. An instance that is no longer in the table, or is
// there at another generation, counts as active too: the request held for
// it is released and looks its route up again (finding none, or the new
// generation, which is a wake of its own). It returns when ctx ends.
func (c *Coordinator) FollowTable(ctx context.Context, t *routes.Table) {
	changed := t.Subscribe()
	for {
		c.syncTable(t)
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// syncTable is one Sync against t's current snapshot.
func (c *Coordinator) syncTable(t *routes.Table) {
	var state map[Key]bool // instance → sleeping, built on first use
	c.Sync(func(k Key) bool {
		if state == nil {
			state = make(map[Key]bool)
			for r := range t.Snapshot().All() {
				state[KeyOf(r)] = r.Sleeping()
			}
		}
		sleeping, ok := state[Key{Workspace: k.Workspace, Sandbox: k.Sandbox, Generation: k.Generation}]
		return !ok || !sleeping
	})
}
