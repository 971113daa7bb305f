// cron-oracle prints supercronic cronexpr's answers (the cron parser KAI-Scheduler's cron usage window uses) for
// the expressions and instants on stdin, so kai-opt's own parser (kai_opt/cron.py) can be checked
// against them: tests/data/cronexpr_next.json is its output. Input: one JSON object per line,
// {"expr": "...", "times": [unix seconds...]}. Output: one JSON object per line with "error" (parse failure)
// or "next" (cronexpr Next in UTC as unix seconds, null when there is none).
// Run: scripts/cron-oracle/run (a throwaway module requiring github.com/aptible/supercronic at KAI's version).
package main

import (
	"bufio"
	"encoding/json"
	"os"
	"time"

	"github.com/aptible/supercronic/cronexpr"
)

type query struct {
	Expr  string  `json:"expr"`
	Times []int64 `json:"times"`
}

type answer struct {
	Expr  string   `json:"expr"`
	Times []int64  `json:"times"`
	Error string   `json:"error,omitempty"`
	Next  []*int64 `json:"next,omitempty"`
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var q query
		if err := json.Unmarshal(in.Bytes(), &q); err != nil {
			panic(err)
		}
		a := answer{Expr: q.Expr, Times: q.Times}
		e, err := cronexpr.Parse(q.Expr)
		if err != nil {
			a.Error = err.Error()
		} else {
			for _, t := range q.Times {
				n := e.Next(time.Unix(t, 0).UTC())
				if n.IsZero() {
					a.Next = append(a.Next, nil)
				} else {
					v := n.Unix()
					a.Next = append(a.Next, &v)
				}
			}
		}
		if err := out.Encode(a); err != nil {
			panic(err)
		}
	}
}
