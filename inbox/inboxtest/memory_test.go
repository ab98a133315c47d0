package inboxtest_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/inboxtest"
	"github.com/onceflow/onceflow/outbox"
)

type order struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
	Mode   string `json:"mode"` // what the test handler does
}

var orderCodec = inbox.JSON[order]{Key: func(o order) (string, error) {
	if o.ID == "" {
		return "", errors.New("no id")
	}
	return o.ID, nil
}}

// memHandler writes a row and an event per step, in two steps, and misbehaves as o.Mode
// says.
func memHandler(t *testing.T) inbox.Handler {
	rows, err := inbox.NewInserter("ledger", "order_id", "step", "amount")
	if err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter("outbox")
	if err != nil {
		t.Fatal(err)
	}
	return inbox.Typed(orderCodec, func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery, o order) (inbox.Progress, error) {
		if err := rows.Insert(ctx, tx, o.ID, d.Step, o.Amount); err != nil {
			return 0, err
		}
		if err := w.Add(ctx, tx, outbox.Event{ID: fmt.Sprintf("%s-%d", o.ID, d.Step), Type: "Booked", Topic: "booked", Key: o.ID,
			Payload: []byte(`{"step":` + fmt.Sprint(d.Step) + `}`), Headers: map[string]string{"h": "v"}}); err != nil {
			return 0, err
		}
		if d.Step == 0 {
			return inbox.Continue, nil
		}
		switch o.Mode {
		case "permanent":
			return 0, inbox.Permanent(errors.New("refused"))
		case "panic":
			panic("boom")
		case "sql":
			_, err := tx.ExecContext(ctx, "UPDATE ledger SET amount = 0")
			return 0, err
		case "zero":
			return 0, nil
		case "forever":
			return inbox.Continue, nil
		}
		return inbox.Done, nil
	})
}

func msg(payload string) *message.Message { return message.NewMessage("m-1", []byte(payload)) }

// TestInMemory checks that the in-memory mode records a committed step's Inserter rows and
// outbox events, and nothing of a step that failed. Every misbehaviour is the Outcome's
// error, as the inbox would count it.
func TestInMemory(t *testing.T) {
	h := memHandler(t)
	row := func(step int) inboxtest.Row {
		return inboxtest.Row{Table: "ledger", Columns: []string{"order_id", "step", "amount"}, Values: []any{"o-1", step, 7}}
	}
	ev := func(step int) inboxtest.Event {
		return inboxtest.Event{Table: "outbox", ID: fmt.Sprintf("o-1-%d", step), Type: "Booked", Topic: "booked", Key: "o-1",
			Payload: []byte(fmt.Sprintf(`{"step":%d}`, step)), Headers: map[string]string{"h": "v"}}
	}
	for _, tc := range []struct {
		name    string
		payload string
		steps   int
		rows    []inboxtest.Row
		events  []inboxtest.Event
		err     error  // errors.Is
		errText string // contained
	}{
		{name: "done in two steps", payload: `{"id":"o-1","amount":7}`, steps: 2, rows: []inboxtest.Row{row(0), row(1)}, events: []inboxtest.Event{ev(0), ev(1)}},
		{name: "poison", payload: `{"amount":7}`, err: inbox.ErrPoison, errText: "no id"},
		{name: "not JSON", payload: `{"id":`, err: inbox.ErrPoison},
		{name: "permanent", payload: `{"id":"o-1","amount":7,"mode":"permanent"}`, steps: 2, rows: []inboxtest.Row{row(0)}, events: []inboxtest.Event{ev(0)}, err: inbox.ErrPermanent},
		{name: "panic", payload: `{"id":"o-1","amount":7,"mode":"panic"}`, steps: 2, rows: []inboxtest.Row{row(0)}, events: []inboxtest.Event{ev(0)}, errText: "panicked: boom"},
		{name: "own sql", payload: `{"id":"o-1","amount":7,"mode":"sql"}`, steps: 2, rows: []inboxtest.Row{row(0)}, events: []inboxtest.Event{ev(0)}, err: inboxtest.ErrOwnSQL, errText: "UPDATE ledger"},
		{name: "zero progress", payload: `{"id":"o-1","amount":7,"mode":"zero"}`, steps: 2, rows: []inboxtest.Row{row(0)}, events: []inboxtest.Event{ev(0)}, err: inbox.ErrInvalidProgress},
		{name: "continue forever", payload: `{"id":"o-1","amount":7,"mode":"forever"}`, steps: inboxtest.MaxSteps, errText: "still answers continue"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := inboxtest.InMemory(t, h, msg(tc.payload))
			if tc.err != nil && !errors.Is(out.Err, tc.err) || tc.err == nil && tc.errText == "" && out.Err != nil {
				t.Fatalf("error %v, want %v", out.Err, tc.err)
			}
			if tc.errText != "" && (out.Err == nil || !strings.Contains(out.Err.Error(), tc.errText)) {
				t.Fatalf("error %v, want one saying %q", out.Err, tc.errText)
			}
			if out.Poison != errors.Is(tc.err, inbox.ErrPoison) {
				t.Fatalf("poison %v", out.Poison)
			}
			if out.Steps != tc.steps {
				t.Fatalf("%d steps, want %d", out.Steps, tc.steps)
			}
			if tc.steps == inboxtest.MaxSteps {
				return
			}
			if !reflect.DeepEqual(out.Rows, tc.rows) {
				t.Fatalf("rows %v, want %v", out.Rows, tc.rows)
			}
			if !reflect.DeepEqual(out.Events, tc.events) {
				t.Fatalf("events %+v, want %+v", out.Events, tc.events)
			}
		})
	}
	out := inboxtest.InMemory(t, h, msg(`{"id":"o-1","amount":7}`))
	if out.Key != "o-1" || out.Progress != inbox.Done || len(out.Table("ledger")) != 2 || out.Table("ledger")[1].Value("step") != 1 || len(out.EventsOfType("Booked")) != 2 {
		t.Fatalf("outcome %+v", out)
	}
}
