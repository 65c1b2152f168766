import { PageHeader } from '../components/PageHeader'

export function SignInPage() {
  return (
    <>
      <PageHeader title="Sign in" description="Sign in with the account your Lanner administrator created." />
      <section className="panel">
        <div className="panel__body muted">Jobs, datasets and artifacts are shared by the team on this box.</div>
      </section>
    </>
  )
}
