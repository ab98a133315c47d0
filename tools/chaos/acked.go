package main

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// ackedClaimMsg is the routers' log line for a partition claim that starts with messages
// acked past its committed offset (pkg/kafkax): the consumer skips them instead of handing
// them out again.
const ackedClaimMsg = "Partition claimed with messages acked past its committed offset"

var (
	ackedOffsetsRE = regexp.MustCompile(`\backed_offsets=(\d+)`)
	ackedGroupRE   = regexp.MustCompile(`\bconsumer_group=(\S+)`)
)

// ackedSkipped reads the routers' logs in dir (router-*.log) and returns, for consumer group
// group, how many claims started with acked messages to skip and how many offsets they
// skipped: the copies the consumer did not hand out again after a router was killed or
// left, beside those the inbox blocked.
func ackedSkipped(dir, group string) (claims, offsets int, err error) {
	logs, err := filepath.Glob(filepath.Join(dir, "router-*.log"))
	if err != nil {
		return 0, 0, err
	}
	for _, p := range logs {
		c, n, err := ackedSkippedIn(p, group)
		if err != nil {
			return 0, 0, err
		}
		claims, offsets = claims+c, offsets+n
	}
	return claims, offsets, nil
}

func ackedSkippedIn(path, group string) (claims, offsets int, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	rd := bufio.NewReader(f)
	for {
		l, err := rd.ReadString('\n')
		if strings.Contains(l, ackedClaimMsg) {
			if g := ackedGroupRE.FindStringSubmatch(l); g != nil && g[1] == group {
				claims++
				if m := ackedOffsetsRE.FindStringSubmatch(l); m != nil {
					n, _ := strconv.Atoi(m[1])
					offsets += n
				}
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return claims, offsets, err
		}
	}
	return claims, offsets, nil
}
