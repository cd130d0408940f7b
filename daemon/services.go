package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/lockfs/lockfs/admin"
	"github.com/lockfs/lockfs/metrics"
)

// startServices opens the admin socket, starts the watch of long waits
// (Config.SlowWait) and, with a MetricsAddr, the metrics endpoint.
func (d *Daemon) startServices(cfg *Config, m *metrics.Metrics) error {
	if cfg.AdminDir != "" {
		srv, err := admin.NewServer(admin.Config{Engine: d.engine, Mountpoint: d.mountpoint, Backend: cfg.Backend,
			Notes: d.fs.Note, Logger: d.log})
		if err != nil {
			return err
		}
		d.adminPath = admin.SocketPath(cfg.AdminDir, d.mountpoint)
		if err := srv.Listen(d.adminPath); err != nil {
			return err
		}
		d.admin = srv
	}
	d.waits = newWaitWatch(d.engine.SnapshotWaited, cfg.SlowWait, d.log)
	d.waits.start()
	if cfg.MetricsAddr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", cfg.MetricsAddr)
	if err != nil {
		return fmt.Errorf("--metrics-addr %s: %w", cfg.MetricsAddr, err)
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

// stopServices closes the admin socket and the metrics endpoint, and stops
// watching long waits.
func (d *Daemon) stopServices() {
	if d.waits != nil {
		d.waits.close()
	}
	if d.admin != nil {
		if err := d.admin.Close(); err != nil {
			d.log.WithError(err).Warn("closing the admin socket")
		}
	}
	if d.metricsSrv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := d.metricsSrv.Shutdown(ctx); err != nil {
			d.log.WithError(err).Warn("stopping the metrics endpoint")
		}
	}
}
