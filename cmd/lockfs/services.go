package main

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/lockfs/lockfs/admin"
	"github.com/lockfs/lockfs/fs"
	"github.com/lockfs/lockfs/metrics"
)

// startServices opens the admin socket, starts the watch of long waits
// (--log-wait-over) and, with --metrics-addr, the metrics endpoint.
func (d *daemon) startServices(mf mountFlags, m *metrics.Metrics, f *fs.FS) error {
	srv, err := admin.NewServer(admin.Config{Engine: d.engine, Mountpoint: d.mountpoint, Backend: mf.backend,
		Notes: f.Note, Logger: d.log})
	if err != nil {
		return err
	}
	d.adminPath = admin.SocketPath(mf.adminDir, d.mountpoint)
	if err := srv.Listen(d.adminPath); err != nil {
		return err
	}
	d.admin = srv
	d.waits = newWaitWatch(d.engine.Snapshot, mf.slowWait, d.log)
	d.waits.start()
	if mf.metricsAddr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", mf.metricsAddr)
	if err != nil {
		return fmt.Errorf("--metrics-addr %s: %w", mf.metricsAddr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	d.metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := d.metricsSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.WithError(err).Error("metrics endpoint stopped")
		}
	}()
	d.log.WithField("addr", ln.Addr().String()).Info("serving metrics at /metrics")
	return nil
}
