package ocsf

// The schema's captions of the ids the records use (the validator in
// ocsftest checks them against the schema).

var categoryNames = map[int]string{
	CategoryIAM:     "Identity & Access Management",
	CategoryNetwork: "Network Activity",
}

var severityNames = map[int]string{
	0:                     "Unknown",
	SeverityInformational: "Informational",
	SeverityLow:           "Low",
	SeverityMedium:        "Medium",
	SeverityHigh:          "High",
}

var statusNames = map[int]string{
	0:             "Unknown",
	StatusSuccess: "Success",
	StatusFailure: "Failure",
	99:            "Other",
}

type class struct {
	name       string
	category   int
	activities map[int]string
}

var classes = map[int]class{
	ClassHTTPActivity:     {"HTTP Activity", CategoryNetwork, httpActivities()},
	ClassNetworkActivity:  {"Network Activity", CategoryNetwork, withUnknownOther(networkActivities)},
	ClassEntityManagement: {"Entity Management", CategoryIAM, withUnknownOther(entityActivities)},
}

// Network Activity's activity ids.
const (
	NetOpen   = 1
	NetClose  = 2
	NetFail   = 4
	NetRefuse = 5
)

var networkActivities = map[int]string{
	NetOpen: "Open", NetClose: "Close", 3: "Reset", NetFail: "Fail", NetRefuse: "Refuse", 6: "Traffic", 7: "Listen",
}

// Entity Management's activity ids.
const (
	EntityCreate = 1
	EntityUpdate = 3
	EntityDelete = 4
)

var entityActivities = map[int]string{
	EntityCreate: "Create", 2: "Read", EntityUpdate: "Update", EntityDelete: "Delete",
}

// httpMethods are HTTP Activity's activity ids by method, in id order
// from 1 (OCSF 1.8.0 names nine; others are 99, Other).
var httpMethods = [...]struct{ method, caption string }{
	{"CONNECT", "Connect"}, {"DELETE", "Delete"}, {"GET", "Get"}, {"HEAD", "Head"},
	{"OPTIONS", "Options"}, {"POST", "Post"}, {"PUT", "Put"}, {"TRACE", "Trace"},
	{"PATCH", "Patch"},
}

// httpRequestMethods are the values http_request.http_method allows.
var httpRequestMethods = map[string]bool{
	"CONNECT": true, "DELETE": true, "GET": true, "HEAD": true, "OPTIONS": true,
	"PATCH": true, "POST": true, "PUT": true, "TRACE": true,
}

func httpActivities() map[int]string {
	m := make(map[int]string, len(httpMethods))
	for i, hm := range httpMethods {
		m[i+1] = hm.caption
	}
	return withUnknownOther(m)
}

// httpActivity returns the activity id of method: 0 when no method is
// known, 99 (Other) for one the class does not name.
func httpActivity(method string) int {
	if method == "" {
		return 0
	}
	for i, hm := range httpMethods {
		if hm.method == method {
			return i + 1
		}
	}
	return 99
}

// withUnknownOther adds the base event's activities 0 (Unknown) and 99
// (Other) to a class's own.
func withUnknownOther(m map[int]string) map[int]string {
	m[0], m[99] = "Unknown", "Other"
	return m
}
