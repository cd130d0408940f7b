package main

import (
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lockfs/lockfs/lockmgr"
)

// slowWaits logs every grant that waited longer than a threshold, as one
// structured line, and passes every event on to the next observer.
type slowWaits struct {
	next      lockmgr.Observer
	threshold time.Duration
	log       logrus.FieldLogger
	host      string
}

var _ lockmgr.Observer = (*slowWaits)(nil)

func (s *slowWaits) Requested(req lockmgr.Request, g lockmgr.Grant, outcome lockmgr.Outcome, took time.Duration) {
	if outcome == lockmgr.Granted && s.threshold > 0 && took >= s.threshold {
		s.log.WithFields(logrus.Fields{
			"path": req.Lock.String(), "kind": req.Lock.Kind.String(), "mode": req.Mode.String(),
			"pid": req.TID, "uid": req.UID, "host": s.host, "token": g.Token, "waited": took.Round(time.Millisecond).String(),
		}).Info("lock granted after a long wait")
	}
	s.next.Requested(req, g, outcome, took)
}

func (s *slowWaits) Lost(id lockmgr.LockID, broken bool) { s.next.Lost(id, broken) }
