client {
  enabled    = true
  servers    = ["127.0.0.1"]
  node_class = "gpu"
  meta {
    rack = "r7"
  }
}
plugin "raw_exec" {
  config {
    enabled = true
  }
}
plugin "docker" {
  config {
    allow_privileged = true
  }
}
plugin "mock_driver" {
  config {
    enabled = true
  }
}
