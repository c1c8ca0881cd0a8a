package gateway

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/routes"
)

// The configuration file's documents are checked at import as `applistener
// validate gateway` checks them: each by routes.ParseDocument, the parser
// of the supervisor that applies it. A document the supervisor would not
// apply (ParseDocument fails), or would apply only in part (an instance
// entry rejected), refuses the whole file: the gateway logs every problem
// at its JSON path, counts the failed reload and keeps the documents it
// imported last.

// maxLoggedProblems bounds the problems logged for one refused file.
const maxLoggedProblems = 100

// ConfigProblem is one problem of a configuration file: the JSON path of
// the value at fault ("supervisors.<id>.instances[2].services[0].port") and
// what is wrong with it.
type ConfigProblem struct {
	Path string
	Msg  string
}

// String is "PATH: MSG".
func (p ConfigProblem) String() string { return p.Path + ": " + p.Msg }

// ConfigProblemsError refuses a configuration file whose documents a
// supervisor would not apply in full. Its message is the first problem
// and how many more there are; Problems has them all.
type ConfigProblemsError struct {
	Problems []ConfigProblem
}

func (e *ConfigProblemsError) Error() string {
	if len(e.Problems) == 1 {
		return "invalid document: " + e.Problems[0].String()
	}
	return fmt.Sprintf("invalid documents: %s (and %d more problems)", e.Problems[0], len(e.Problems)-1)
}

// checkDocuments parses every document of docs as a supervisor does and
// returns every problem, in the order of the ids and of the entries, or
// nil when there is none.
func checkDocuments(docs map[string]document) error {
	ids := make([]string, 0, len(docs))
	for sup := range docs {
		ids = append(ids, sup)
	}
	slices.Sort(ids)
	var problems []ConfigProblem
	for _, sup := range ids {
		at := "supervisors." + sup
		doc, err := routes.ParseDocument(docs[sup].body)
		if err != nil {
			problems = append(problems, ConfigProblem{Path: at, Msg: api.OneLineReason(strings.TrimPrefix(err.Error(), "document: "))})
			continue
		}
		for _, rj := range doc.Rejected {
			entry := at + ".instances[" + strconv.Itoa(rj.Index) + "]"
			for _, p := range rj.Problems {
				path := entry
				if p.Path != "" {
					path += "." + p.Path
				}
				problems = append(problems, ConfigProblem{Path: path, Msg: api.OneLineReason(p.Msg)})
			}
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return &ConfigProblemsError{Problems: problems}
}
