job "writer" {
  group "g" {
    count = 1
    volume "data" {
      type            = "csi"
      source          = "vol0"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
      mount_options {
        fs_type = "ext4"
      }
    }
    task "w" {
      driver = "exec"
      volume_mount {
        volume      = "data"
        destination = "/data"
      }
      kill_timeout = "2s"
    }
  }
}
