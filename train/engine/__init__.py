"""The training engine: device, precision, optimizer, clipping and the generic loop."""
