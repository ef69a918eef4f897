job "0.5plugin" {
  type        = "system"
  datacenters = ["dc1"]
  group "nodes" {
    task "plugin" {
      driver = "raw_exec"
      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config f      config fig fig fig fig fig fig fig fig fig fig fig fig fig fig fig fig fig fig fig fig fig fig fig fig fig fig fig fig fig fig fig {
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
