package pagecache

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -target bpfel -type event pagecache pagecache.c -- -I/usr/include/x86_64-linux-gnu -O2 -g -Wall -Werror
