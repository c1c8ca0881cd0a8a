package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"unicode/utf8"

	"github.com/applistener/applistener/control/internal/ndjson"
	"github.com/applistener/applistener/control/internal/pollfile"
	"github.com/applistener/applistener/routes"
)

// loadConfigFile reads and parses the configuration file. The identity
// is taken before the read, so a change during the read is seen next time.
func loadConfigFile(path string) (pollfile.Identity, map[string]document, error) {
	id, _ := pollfile.Stat(path)
	data, err := pollfile.ReadLimited(path, MaxConfigBytes)
	if err != nil {
		return id, nil, fmt.Errorf("config file: %w", err)
	}
	docs, err := parseConfigFile(data)
	if err != nil {
		return id, nil, fmt.Errorf("config file %s: %w", path, err)
	}
	return id, docs, nil
}

// parseConfigFile parses {"supervisors": {"<id>": {...}, ...}}: the top
// level has exactly the key "supervisors", ids are distinct and valid, and
// every section is a JSON object of at most routes.MaxDocumentBytes once
// compacted (with its newline), which the supervisor's parser takes in full
// (checkDocuments: every problem of every section, at its JSON path).
//
// The file is validated and compacted by one pass of json.Compact; the
// result is then read member by member with encoding/json's Decoder, which
// hands over the keys in order, so a repeated key is refused (decoding into
// a map would silently keep the last one). No hand-written scanner is
// needed here (routes.ParseDocument has one because it validates a large
// document one entry at a time and steps aside between entries, on the
// data plane's processor): this file is read only when it changes, and the
// reload that reads it spends more time parsing its sections for the
// discovery grants (discoveryGrants) than reading it.
func parseConfigFile(data []byte) (map[string]document, error) {
	docs, err := parseConfigSections(data)
	if err != nil {
		return nil, err
	}
	if err := checkDocuments(docs); err != nil {
		return nil, err
	}
	return docs, nil
}

// parseConfigSections is the structural pass of parseConfigFile: the top
// level, the ids and each section's shape and size, the sections kept as
// written (compacted) and not parsed as documents.
func parseConfigSections(data []byte) (map[string]document, error) {
	if !utf8.Valid(data) {
		return nil, errors.New("not valid UTF-8")
	}
	var buf bytes.Buffer
	buf.Grow(len(data))
	if err := json.Compact(&buf, data); err != nil {
		return nil, jsonSyntaxError(data)
	}
	dec := json.NewDecoder(bytes.NewReader(buf.Bytes()))
	var docs map[string]document
	err := objectMembers(dec, "top level must be a JSON object", func(key string) error {
		if key != "supervisors" {
			return fmt.Errorf("unknown top-level key %q (want only \"supervisors\")", key)
		}
		if docs != nil {
			return errors.New(`"supervisors" appears twice`)
		}
		var err error
		docs, err = parseSupervisors(dec)
		return err
	})
	if err != nil {
		return nil, err
	}
	if docs == nil {
		return nil, errors.New(`missing "supervisors"`)
	}
	return docs, nil
}

// logConfigProblems logs every problem of a refused configuration file,
// one line each, at most maxLoggedProblems.
func logConfigProblems(log *slog.Logger, path string, err error) {
	var pe *ConfigProblemsError
	if !errors.As(err, &pe) {
		return
	}
	for i, p := range pe.Problems {
		if i == maxLoggedProblems {
			log.Error("gateway config: more problems not logged", "path", path, "problems", len(pe.Problems))
			return
		}
		log.Error("gateway config: invalid document", "path", path, "at", p.Path, "problem", p.Msg)
	}
}

// parseSupervisors parses the "supervisors" object that dec is at.
func parseSupervisors(dec *json.Decoder) (map[string]document, error) {
	docs := make(map[string]document)
	err := objectMembers(dec, `"supervisors" must be a JSON object`, func(sup string) error {
		if err := validSupervisorID(sup); err != nil {
			return fmt.Errorf("supervisors: %w", err)
		}
		if _, dup := docs[sup]; dup {
			return fmt.Errorf("supervisors: %q appears twice", sup)
		}
		var value json.RawMessage // compact, and a copy of its own
		if err := dec.Decode(&value); err != nil {
			return fmt.Errorf("supervisors[%q]: %w", sup, err)
		}
		if value[0] != '{' {
			return fmt.Errorf("supervisors[%q]: the configuration document must be a JSON object", sup)
		}
		if len(value)+1 > routes.MaxDocumentBytes {
			return fmt.Errorf("supervisors[%q]: the configuration document is %d bytes, larger than a supervisor accepts (%d)",
				sup, len(value), routes.MaxDocumentBytes-1)
		}
		docs[sup] = newDocument([]byte(value), 0)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return docs, nil
}

// jsonSyntaxError explains why data is not valid JSON, with the line and
// column of the error when known. (json.Compact's errors carry no offset.)
func jsonSyntaxError(data []byte) error {
	err := json.Unmarshal(data, new(json.RawMessage))
	var se *json.SyntaxError
	if !errors.As(err, &se) {
		return fmt.Errorf("not valid JSON: %w", err)
	}
	// Offset counts the offending byte.
	off := min(int(se.Offset), len(data))
	line := 1 + bytes.Count(data[:off], ndjson.Newline)
	col := max(1, off-bytes.LastIndexByte(data[:off], '\n')-1)
	return fmt.Errorf("not valid JSON at line %d, column %d: %w", line, col, err)
}
