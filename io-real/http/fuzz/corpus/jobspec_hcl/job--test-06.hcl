job "web" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      service {
        tags                = ["a", "b"]
        enable_tag_override = true
        meta {
          version = 2
        }
        check {
          type     = "script"
          command  = "/bin/true"
          interval = "10s"
          timeout  = "2s"
        }
      }
      service {
        name         = "${JOB}-admin"
        port         = "9090"
        address_mode = "driver"
        check {
          name     = "admin alive"
          type     = "tcp"
          interval = "5s"
          timeout  = "1s"
        }
      }
    }
  }
}
