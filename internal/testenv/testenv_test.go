package testenv_test

import (
	"testing"

	"github.com/onceflow/onceflow/internal/testenv"
)

func TestDBAndTopic(t *testing.T) {
	d := testenv.DB(t, 2)
	var n int
	if err := d.DB.QueryRow("SELECT COUNT(*) FROM inbox").Scan(&n); err != nil || n != 0 {
		t.Fatalf("fresh inbox: n=%d err=%v", n, err)
	}
	if _, err := d.DB.Exec("CREATE TABLE nope (id INT)"); err == nil {
		t.Fatal("the application user must not have DDL rights")
	}
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "testenv", 3)
	parts, err := k.CheckTopics(topic)
	if err != nil || parts[topic] != 3 {
		t.Fatalf("topic %s: %v %v", topic, parts, err)
	}
}
