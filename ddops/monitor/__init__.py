"""The operator's monitoring: Prometheus targets, recording and alert rules, a Grafana dashboard
(`ddops monitor render`)."""
