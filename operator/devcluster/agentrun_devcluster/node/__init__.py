"""The real node (`agentrun dev up --runtime kubelet`): containerd, the kubelet and kube-scheduler."""
