package fuse

// Maximum file write size we are prepared to receive from the kernel:
// 1 MiB, the kernel's limit (fuse_max_pages_limit, 256 pages), which
// it allows when the INIT reply sets InitMaxPages (Linux 4.20+).
//
// Linux 4.2.0 has been observed to cap this value at 128kB
// (FUSE_MAX_PAGES_PER_REQ=32, 4kB pages).
const maxWrite = 1024 * 1024
