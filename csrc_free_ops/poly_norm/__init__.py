"""PolyNorm: y = w0*norm(x^3) + w1*norm(x^2) + w2*norm(x) + b over the last dim."""
