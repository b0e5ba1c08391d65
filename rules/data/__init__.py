"""LA2xx: data loading and host-to-device transfers feeding CUDA training."""
