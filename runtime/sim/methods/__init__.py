"""The simulated device's Objective-C methods, by the objects they belong to."""
