job "web" {
  meta {
    owner = "job-team"
    tier  = "1"
  }
  group "g" {
    meta { tier = "2" }
    task "t" {
      driver = "raw_exec"
      meta { owner = "task-team" }
    }
  }
}
