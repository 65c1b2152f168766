import { Link } from 'react-router'
import { EmptyState } from '../components/EmptyState'
import { HardwarePanel } from '../components/HardwarePanel'
import { PageHeader } from '../components/PageHeader'
import { useHealth } from '../health'

export function QueuePage() {
  const health = useHealth()
  return (
    <>
      <PageHeader
        title="Queue"
        description="Fine-tuning and export jobs in the order the workers will run them."
        actions={
          <Link to="/jobs/new" className="button button--primary">
            New fine-tune
          </Link>
        }
      />
      <div className="grid grid--main-side">
        <section className="panel" aria-labelledby="jobs-heading">
          <header className="panel__header">
            <h2 id="jobs-heading">Jobs</h2>
          </header>
          <div className="panel__body">
            <EmptyState title="No jobs yet">
              <p>
                Pick a model and a dataset to start one: <Link to="/jobs/new">New fine-tune</Link>.
              </p>
            </EmptyState>
          </div>
        </section>
        <HardwarePanel state={health} />
      </div>
    </>
  )
}
