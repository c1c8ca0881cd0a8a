package supervisor

import (
	"log/slog"
	"strconv"
	"strings"

	"github.com/applistener/applistener/routes"
)

// rejectedAttrs are the log fields of an instance entry that failed
// validation, shared by the routes file and the gateway sources: where it
// is (index, workspace, sandbox), its one-line reason, the full JSON path
// in the document of the field at fault (of its first problem:
// "instances[2].services[0].port"), and every problem at its full path.
func rejectedAttrs(rj routes.RejectedInstance) []any {
	entry := "instances[" + strconv.Itoa(rj.Index) + "]"
	path := entry
	problems := make([]string, 0, len(rj.Problems))
	for i, p := range rj.Problems {
		at := entry
		if p.Path != "" {
			at += "." + p.Path
		}
		if i == 0 {
			path = at
		}
		problems = append(problems, at+": "+p.Msg)
	}
	return []any{
		"class_uid", 3004, "index", rj.Index, "workspace", rj.Workspace, "sandbox", rj.Sandbox,
		"path", path, "reason", rj.Reason, "problems", strings.Join(problems, "; "),
	}
}

// logRejected logs one rejected instance entry at warn.
func logRejected(log *slog.Logger, rj routes.RejectedInstance) {
	log.Warn("instance rejected", rejectedAttrs(rj)...)
}
