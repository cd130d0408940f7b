// Command gcsemulator serves the GCS JSON API on a loopback port from an
// in-memory store: gcsemu (github.com/fullstorydev/emulators/storage,
// forked under third_party/ with its listings started at their prefix, so
// that every request stays well under a millisecond with 100,000 objects
// stored). Package gcstest builds and starts it for tests, and the bench
// for its GCS measurements.
//
// It answers GET /_internal/healthcheck with 200 once it serves, as
// fake-gcs-server does, so that both emulators are started the same way.
// Buckets are created with the JSON API (POST /storage/v1/b); note that
// gcsemu also creates a missing bucket on the first write into it, so a
// test that needs a missing bucket refused uses fake-gcs-server.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"

	"github.com/fullstorydev/emulators/storage/gcsemu"
)

func main() {
	host := flag.String("host", "127.0.0.1", "the address to listen on")
	port := flag.Int("port", 0, "the port to listen on (0: any free one, printed on standard output)")
	verbose := flag.Bool("verbose", false, "log every request")
	flag.Parse()

	emu := gcsemu.NewGcsEmu(gcsemu.Options{
		Verbose: *verbose,
		Log: func(err error, format string, args ...interface{}) {
			if err != nil {
				log.Printf("ERROR: "+format+": %v", append(args, err)...)
				return
			}
			log.Printf(format, args...)
		},
	})
	mux := http.NewServeMux()
	emu.Register(mux)
	mux.HandleFunc("/_internal/healthcheck", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
	})
	l, err := net.Listen("tcp", net.JoinHostPort(*host, strconv.Itoa(*port)))
	if err != nil {
		fmt.Fprintf(os.Stderr, "gcsemulator: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("gcsemulator listening on http://%s\n", l.Addr())
	if err := http.Serve(l, mux); err != nil {
		fmt.Fprintf(os.Stderr, "gcsemulator: %v\n", err)
		os.Exit(1)
	}
}
