//go:build !race

package balancer

const raceEnabled = false
