"""What talks to Ray from the control plane: finding and joining a cluster (`cluster`), a job's
attempt as a Ray Train run (`launcher`), the nodes' health (`node_health`), the autoscaler
(`autoscaler`), where a Ray Job came from (`origin`), and every use of Ray's private APIs
(`internals`)."""
