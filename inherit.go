package bulwark

// inheritOff is how a sub-policy's Disabled inherits: an upstream's own
// Enabled or Disabled wins, else Default's Disabled applies. Every
// sub-policy's inherit method uses it, so the rule is written once.
func inheritOff(disabled, enabled, parent bool) bool {
	if enabled {
		return false
	}
	return disabled || parent
}
