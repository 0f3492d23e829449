"""Serial reference layers, models and optimisers with explicit backward passes in matrix form."""
