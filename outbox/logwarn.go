package outbox

import "github.com/ThreeDotsLabs/watermill"

// warner is a logger with a WARN level, as the router's is. Watermill's LoggerAdapter has no
// such level.
type warner interface {
	Warn(msg string, fields watermill.LogFields)
}

// warn logs msg at WARN when logger has that level, else at INFO.
func warn(logger watermill.LoggerAdapter, msg string, fields watermill.LogFields) {
	if w, ok := logger.(warner); ok {
		w.Warn(msg, fields)
		return
	}
	logger.Info(msg, fields)
}
