"""Rotary position embedding in the HuggingFace convention (rotate_half):
out = x*cos + rotate_half(x)*sin over the first R dims of each head, the
remaining D - R dims passing through unchanged."""
