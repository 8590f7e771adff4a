// Internals of package dabb that its external tests use.

package dabb

// AdvertiseAddr is advertiseAddr, for TestAdvertiseAddr.
var AdvertiseAddr = advertiseAddr
