package main

import (
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/spf13/pflag"

	"github.com/lockfs/lockfs/etcdbackend"
)

// etcdFlags are the flags of the etcd backend, named after etcdctl's
// (--endpoints, --cacert, --cert, --key, --user NAME[:PASSWORD]) with an
// etcd- prefix. The lease TTL and host id are the shared --lease-ttl and
// --host-id. A password is never read from the environment: it comes with
// --etcd-user NAME:PASSWORD or, kept out of ps and /etc/fstab, from the
// first line of --etcd-password-file.
type etcdFlags struct {
	endpoints    string
	prefix       string
	cacert       string
	cert         string
	key          string
	user         string
	passwordFile string
}

// register declares the etcd flags on fs; who says which command's help
// they are in ("etcd backend" for mount, "etcd" for lock).
func (e *etcdFlags) register(fs *pflag.FlagSet, who string) {
	fs.StringVar(&e.endpoints, "etcd-endpoints", "", who+": the etcd cluster's client URLs, separated by commas, or by ; in -o and /etc/fstab (http://HOST:2379,... or https://...)")
	fs.StringVar(&e.prefix, "etcd-prefix", "", who+": key prefix of the lock namespace (default "+etcdbackend.DefaultPrefix+")")
	fs.StringVar(&e.cacert, "etcd-cacert", "", who+": PEM file of the CA that signed the etcd servers' certificates (turns TLS on)")
	fs.StringVar(&e.cert, "etcd-cert", "", who+": PEM client certificate, for etcd's client-certificate authentication (with --etcd-key)")
	fs.StringVar(&e.key, "etcd-key", "", who+": PEM key of --etcd-cert")
	fs.StringVar(&e.user, "etcd-user", "", who+": etcd user, NAME or NAME:PASSWORD as etcdctl's --user")
	fs.StringVar(&e.passwordFile, "etcd-password-file", "", who+": file whose first line is --etcd-user's password")
}

// set reports whether any etcd flag was given.
func (e etcdFlags) set() bool { return e != etcdFlags{} }

// validate checks the etcd flags against the chosen backend.
func (e etcdFlags) validate(backend string, ttl time.Duration) error {
	if backend != "etcd" {
		if e.set() {
			return usagef("--etcd-* flags need --backend etcd")
		}
		return nil
	}
	if e.endpoints == "" {
		return usagef("--backend etcd needs --etcd-endpoints (e.g. http://10.0.0.1:2379,http://10.0.0.2:2379)")
	}
	if _, pw, ok := strings.Cut(e.user, ":"); ok && pw != "" && e.passwordFile != "" {
		return usagef("--etcd-user NAME:PASSWORD and --etcd-password-file exclude each other")
	}
	if e.passwordFile != "" && e.user == "" {
		return usagef("--etcd-password-file needs --etcd-user")
	}
	if ttl < time.Second {
		return usagef("--lease-ttl %v: the etcd backend's leases are whole seconds, at least 1s (default %v)",
			ttl, etcdbackend.DefaultTTL)
	}
	if err := e.config(gcsFlags{ttl: ttl}, nil).Validate(); err != nil {
		return usagef("%v", err)
	}
	return nil
}

// config is the backend's configuration, without the password; the lease
// TTL, host id and lock-delay are the flags shared with gcs.
func (e etcdFlags) config(g gcsFlags, log logrus.FieldLogger) etcdbackend.Config {
	var eps []string
	// "," as etcdctl; ";" in mount options, where "," ends the option.
	for _, ep := range strings.FieldsFunc(e.endpoints, func(r rune) bool { return r == ',' || r == ';' }) {
		if ep = strings.TrimSpace(ep); ep != "" {
			eps = append(eps, ep)
		}
	}
	user, pw, _ := strings.Cut(e.user, ":")
	return etcdbackend.Config{Endpoints: eps, Prefix: e.prefix, CACert: e.cacert, Cert: e.cert, Key: e.key,
		Username: user, Password: pw, TTL: g.ttl, HostID: g.hostID, LockDelay: g.lockDelay.config(), Logger: log}
}

// describe is the etcd backend as the startup log line names it.
func (e etcdFlags) describe() string {
	s := "etcd endpoints=" + e.endpoints
	if e.prefix != "" {
		s += " prefix=" + e.prefix
	}
	if user, _, _ := strings.Cut(e.user, ":"); user != "" {
		s += " user=" + user
	}
	return s
}
