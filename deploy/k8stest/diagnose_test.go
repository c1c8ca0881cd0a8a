package k8stest

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// describe logs what an operator would look at when a rollout stalls: the
// nodes' Ready conditions and leases, every Pod of ns with its node, phase,
// conditions and deletion mark, the Deployments' and ReplicaSets' counts,
// and the namespace's events in time order. It is called when a wait of
// the chart test fails, so that a stall on a CI machine explains itself.
func (c *cluster) describe(t *testing.T, ns string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b strings.Builder
	now := time.Now()
	if nodes, err := c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err == nil {
		for _, n := range nodes.Items {
			fmt.Fprintf(&b, "node %s:", n.Name)
			for _, cd := range n.Status.Conditions {
				if cd.Type == corev1.NodeReady {
					fmt.Fprintf(&b, " Ready=%s (%s, heartbeat %s ago)", cd.Status, cd.Reason, now.Sub(cd.LastHeartbeatTime.Time).Round(time.Second))
				}
			}
			for _, tn := range n.Spec.Taints {
				fmt.Fprintf(&b, " taint %s:%s", tn.Key, tn.Effect)
			}
			b.WriteByte('\n')
		}
	} else {
		fmt.Fprintf(&b, "nodes: %v\n", err)
	}
	if leases, err := c.client.CoordinationV1().Leases("kube-node-lease").List(ctx, metav1.ListOptions{}); err == nil {
		for _, l := range leases.Items {
			if l.Spec.RenewTime != nil {
				fmt.Fprintf(&b, "node lease %s renewed %s ago\n", l.Name, now.Sub(l.Spec.RenewTime.Time).Round(time.Second))
			}
		}
	}
	if deps, err := c.client.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, d := range deps.Items {
			fmt.Fprintf(&b, "deployment %s: generation %d observed %d, replicas %d updated %d ready %d available %d unavailable %d\n",
				d.Name, d.Generation, d.Status.ObservedGeneration, d.Status.Replicas, d.Status.UpdatedReplicas,
				d.Status.ReadyReplicas, d.Status.AvailableReplicas, d.Status.UnavailableReplicas)
			for _, cd := range d.Status.Conditions {
				fmt.Fprintf(&b, "  %s=%s %s: %s\n", cd.Type, cd.Status, cd.Reason, cd.Message)
			}
		}
	}
	if rss, err := c.client.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, rs := range rss.Items {
			fmt.Fprintf(&b, "replicaset %s: spec %d, status %d ready %d available %d\n",
				rs.Name, *rs.Spec.Replicas, rs.Status.Replicas, rs.Status.ReadyReplicas, rs.Status.AvailableReplicas)
		}
	}
	if pods, err := c.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, p := range pods.Items {
			fmt.Fprintf(&b, "pod %s on %q: phase %s, ip %s", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.PodIP)
			if p.DeletionTimestamp != nil {
				fmt.Fprintf(&b, ", deleting since %s", now.Sub(p.DeletionTimestamp.Time).Round(time.Second))
			}
			for _, cd := range p.Status.Conditions {
				fmt.Fprintf(&b, ", %s=%s", cd.Type, cd.Status)
				if cd.Reason != "" {
					fmt.Fprintf(&b, "(%s)", cd.Reason)
				}
			}
			b.WriteByte('\n')
		}
	}
	if evs, err := c.client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{}); err == nil {
		items := evs.Items
		sort.Slice(items, func(i, j int) bool { return eventTime(items[i]).Before(eventTime(items[j])) })
		for _, e := range items {
			fmt.Fprintf(&b, "event %s %s/%s %s: %s (x%d)\n", eventTime(e).Format("15:04:05"),
				e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message, max(e.Count, 1))
		}
	}
	t.Logf("state of namespace %s:\n%s", ns, b.String())
}

// eventTime is when e last happened, by whichever field its reporter set.
func eventTime(e corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}
