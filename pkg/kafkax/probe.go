package kafkax

import (
	"context"
	"errors"
	"time"

	"github.com/IBM/sarama"
)

// Probe asks the cluster for its metadata once, within ctx's deadline, as a readiness
// check. The deadline is 3s when ctx has none. Probe opens one client per call, with dial,
// read and write timeouts of the time left and no metadata retries. So a broker that
// accepts connections and never answers costs one connection per call, which the read
// timeout closes. It never costs a hang. Probe returns when ctx is done, even if the client
// has not given up yet. The client closes itself within the timeouts.
func (c Config) Probe(ctx context.Context) error {
	d := 3 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		d = time.Until(dl)
	}
	if d <= 0 {
		return context.DeadlineExceeded
	}
	sc := c.base()
	sc.Net.DialTimeout = min(d, sc.Net.DialTimeout)
	sc.Net.ReadTimeout = d
	sc.Net.WriteTimeout = d
	sc.Metadata.Retry.Max = 0
	sc.Metadata.Timeout = d
	sc.Metadata.Full = true // NewClient fetches the cluster's metadata: the probe itself
	done := make(chan error, 1)
	go func() {
		client, err := sarama.NewClient(c.Brokers, sc)
		if err == nil {
			if len(client.Brokers()) == 0 {
				err = errors.New("kafka: metadata lists no brokers")
			}
			_ = client.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			return Unreachable(c.Brokers, err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
