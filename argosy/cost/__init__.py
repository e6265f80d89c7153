"""Cost estimation: $ per million tokens, cost of ownership, break-even against hosted APIs."""
