"""Operations: the health endpoint, Prometheus metrics and structured logs."""
