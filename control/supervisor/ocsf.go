package supervisor

import (
	"time"

	"github.com/applistener/applistener/internal/ocsf"
	"github.com/applistener/applistener/routes"
)

// ocsfRejected records an instance entry of a delivered document that
// failed validation: an Entity Management record (a Create that failed,
// at warn). em may be nil.
func ocsfRejected(em *ocsf.Emitter, doc *routes.Document, rj routes.RejectedInstance) {
	em.Emit(ocsf.InstanceRejected(&ocsf.InstanceRejection{
		Time: time.Now(), Workspace: rj.Workspace, Sandbox: rj.Sandbox, Index: rj.Index, Reason: rj.Reason, Revision: doc.Revision,
	}))
}
