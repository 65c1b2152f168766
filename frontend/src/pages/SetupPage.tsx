import { PageHeader } from '../components/PageHeader'

export function SetupPage() {
  return (
    <>
      <PageHeader
        title="Set up Lanner"
        description="First run: create the administrator account that manages users, workers and storage."
      />
      <section className="panel">
        <div className="panel__body muted">
          This page appears once, while no user exists. After setup, everyone signs in.
        </div>
      </section>
    </>
  )
}
