job "plugin" {
  type        = "system"
  datacenters = ["dc1"]
  group "nodes" {
    task "plugin" {
      driver = "raw_exec"
      config {
        command = "drover-csi-fake"
        args    = ["--endpoint", "${CSI_ENDPOINT}"]
      }
      csi_plugin {
        id             = "fake"
        type           = "monolith"
        mount_dir      = "/csi"
        health_timeout = "1m30s"
      }
      resources {
        cpu    = 50
        memory = 64
      }
    }
  }
}
